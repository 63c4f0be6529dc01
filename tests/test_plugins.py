"""Plugins: user modules named in the config (``plugins:``) or with ``--plugin`` are imported before the
config is checked, so the names they register are valid; problems are one line naming the plugin."""

from __future__ import annotations

import sys

import pytest

from searchr1.config import ConfigError, load_config, to_dict
from searchr1.rewards.registry import REWARD_COMPONENTS

PLUGIN = """
from searchr1.rewards import RewardComponent, register_reward

@register_reward("{name}")
class Short(RewardComponent):
    def score(self, ctx):
        return float(ctx.answer is not None and len(ctx.answer.split()) <= 3)
"""


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A folder outside the package holding plugin modules; what they register is removed after."""
    monkeypatch.chdir(tmp_path)
    before = set(REWARD_COMPONENTS)
    path_before = list(sys.path)
    yield tmp_path
    for name in set(REWARD_COMPONENTS) - before:
        REWARD_COMPONENTS.remove(name)
    for module in [m for m, mod in sys.modules.items() if str(tmp_path) in str(getattr(mod, "__file__", ""))]:
        del sys.modules[module]
    sys.path[:] = path_before


def test_a_plugin_named_in_the_config_makes_its_names_valid(plugin_dir):
    (plugin_dir / "conf").mkdir()
    (plugin_dir / "conf" / "short_reward.py").write_text(PLUGIN.format(name="test_short"))
    (plugin_dir / "conf" / "run.yaml").write_text(
        "plugins: [short_reward]\nreward:\n  components: {test_short: 1.0}\n"
    )
    with pytest.raises(ConfigError, match=r"reward\.components: unknown reward component 'test_short'"):
        load_config(overrides=["reward.components={test_short: 1.0}"])
    # found beside the config file, though neither on sys.path nor in the current folder
    cfg = load_config(plugin_dir / "conf" / "run.yaml")
    assert cfg.plugins == ["short_reward"] and "test_short" in REWARD_COMPONENTS
    assert to_dict(cfg)["plugins"] == ["short_reward"]  # a run's config.yaml imports it again


def test_plugin_flags_add_to_the_config_list_and_py_files_work(plugin_dir):
    (plugin_dir / "a_reward.py").write_text(PLUGIN.format(name="test_a"))
    (plugin_dir / "b_reward.py").write_text(PLUGIN.format(name="test_b"))
    cfg = load_config(
        overrides=["plugins=[a_reward]", "reward.components={test_a: 1.0, test_b: 0.5}"],
        plugins=["b_reward.py", "a_reward"],
    )
    assert cfg.plugins == ["a_reward", "b_reward.py"]
    assert {"test_a", "test_b"} <= set(REWARD_COMPONENTS)
    load_config(plugins=["b_reward.py"])  # imported once: no "already registered"


def test_plugin_problems_are_one_line(plugin_dir):
    with pytest.raises(
        ConfigError, match=r"plugins: no module named 'no_such_plugin' \(looked on sys.path and in"
    ):
        load_config(plugins=["no_such_plugin"])
    with pytest.raises(ConfigError, match=r"plugins: missing\.py: file not found"):
        load_config(plugins=["missing.py"])
    (plugin_dir / "needs_more.py").write_text("import no_such_dependency_xyz\n")
    with pytest.raises(ConfigError, match=r"plugins: needs_more: No module named 'no_such_dependency_xyz'"):
        load_config(plugins=["needs_more"])
    (plugin_dir / "broken.py").write_text("raise RuntimeError('half written')\n")
    with pytest.raises(
        ConfigError, match=r"plugins: broken failed while importing: RuntimeError: half written"
    ):
        load_config(plugins=["broken"])
    (plugin_dir / "twice.py").write_text(PLUGIN.format(name="exact_match"))
    with pytest.raises(ConfigError, match=r"reward component 'exact_match' is already registered"):
        load_config(plugins=["twice.py"])
    with pytest.raises(ConfigError, match=r"plugins: expected a list"):
        load_config(overrides=["plugins=one_module"])


def test_list_keys_and_help_show_the_names_a_plugin_registers(plugin_dir, capsys):
    from searchr1.cli import main

    (plugin_dir / "c_reward.py").write_text(PLUGIN.format(name="test_c"))
    assert main(["train", "--plugin", "c_reward", "--list-keys"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "Registered:" in x and "exact_match" in x)
    assert "test_c" in line
    with pytest.raises(SystemExit) as done:
        main(["train", "--plugin", "c_reward.py", "--help"])
    assert done.value.code == 0
    names = capsys.readouterr().out.split("registered names", 1)[1]
    assert "reward.components:" in names and "test_c" in names and "rollout.engine: hf" in names
