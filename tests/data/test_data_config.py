"""The ``data`` config section rejects unusable templates by their dotted key."""

from __future__ import annotations

import pytest

from searchr1.config import ConfigError, load_config


def test_data_template_is_checked(tmp_path):
    assert load_config(None, ["data.template=instruct"]).data.template == "instruct"
    good = tmp_path / "t.txt"
    good.write_text("Q: {question}")
    assert load_config(None, [f"data.template={good}"]).data.template == str(good)
    with pytest.raises(ConfigError, match=r"data\.template: 'chat'"):
        load_config(None, ["data.template=chat"])
    bad = tmp_path / "b.txt"
    bad.write_text("no slot")
    with pytest.raises(ConfigError, match=r"data\.template: .*no \{question\} slot"):
        load_config(None, [f"data.template={bad}"])
