from __future__ import annotations

import pytest

from searchr1.config import ConfigError, SearchR1Config, describe, load_config, to_dict


def test_defaults_load_and_roundtrip(tmp_path):
    cfg = load_config()
    assert isinstance(cfg, SearchR1Config)
    path = tmp_path / "c.yaml"
    import yaml

    path.write_text(yaml.safe_dump(to_dict(cfg)))
    assert load_config(path) == cfg


def test_yaml_then_dotted_overrides_win(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  n: 8\n  temperature: 0.7\nseed: 3\n")
    cfg = load_config(path, ["rollout.n=2", "rollout.temperature=1e-1", "retrieval.backend=dense"])
    assert cfg.rollout.n == 2
    assert cfg.rollout.temperature == pytest.approx(0.1)
    assert cfg.retrieval.backend == "dense"
    assert cfg.seed == 3


def test_int_is_accepted_for_float_and_lists_parse():
    cfg = load_config(overrides=["rollout.temperature=1", "data.train_files=[a.parquet, b.parquet]"])
    assert isinstance(cfg.rollout.temperature, float)
    assert cfg.data.train_files == ["a.parquet", "b.parquet"]


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("rollout.nn=3", "rollout.nn"),
        ("rolout.n=3", "rolout"),
        ("rollout.n=three", "rollout.n"),
        ("rollout.n=1.5", "rollout.n"),
        ("rollout.temperature=hot", "rollout.temperature"),
        ("seed", "key=value"),
    ],
)
def test_bad_keys_and_types_name_the_key(override, fragment):
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        load_config(overrides=[override])


def test_unknown_key_in_yaml_suggests_the_close_one(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  max_turn: 3\n")
    with pytest.raises(ConfigError, match=r"rollout\.max_turn'.*did you mean 'rollout\.max_turns'"):
        load_config(path)


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_describe_documents_every_leaf():
    rows = describe()
    keys = {k for k, _, _ in rows}
    assert "rollout.max_turns" in keys and "seed" in keys
    assert all(doc for _, _, doc in rows), [k for k, _, d in rows if not d]
