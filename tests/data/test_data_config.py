"""The ``data`` config section rejects unusable templates by their dotted key."""

from __future__ import annotations

import pytest

from searchr1.config import ConfigError, load_config


def test_data_template_is_checked(tmp_path):
    assert load_config(None, ["data.template=instruct"]).data.template == "instruct"
    good = tmp_path / "t.txt"
    good.write_text("Q: {question}")
    assert load_config(None, [f"data.template={good}"]).data.template == str(good)
    with pytest.raises(ConfigError, match=r"data\.template: prompt template 'chat' is neither"):
        load_config(None, ["data.template=chat"])
    bad = tmp_path / "b.txt"
    bad.write_text("no slot")
    with pytest.raises(ConfigError, match=r"data\.template: .*no \{question\} slot"):
        load_config(None, [f"data.template={bad}"])
    messages = tmp_path / "m.yaml"
    messages.write_text("- {role: system, content: Be brief.}\n- {role: user, content: '{question}'}\n")
    assert load_config(None, [f"data.template={messages}"]).data.template == str(messages)
    messages.write_text("- {role: user, content: no slot}\n")
    with pytest.raises(ConfigError, match=r"data\.template: .*no \{question\} slot"):
        load_config(None, [f"data.template={messages}"])
    messages.write_text("just: a mapping\n")
    with pytest.raises(ConfigError, match=r"expected a list of chat messages"):
        load_config(None, [f"data.template={messages}"])
