"""`searchr1 demo --quick`: world, BM25, tiny model, validation before / after, plots (slow: minutes)."""

from __future__ import annotations

import pytest

from searchr1.cli import main


@pytest.mark.slow
def test_demo_quick(tmp_path, capsys):
    assert main(["demo", "--quick", "--steps", "2", "--out", str(tmp_path / "demo"), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "validation before / after training" in out
    assert "val/em" in out and "val/synth/em" in out
    for name in ("overview.png", "reward.png", "validation.png"):
        assert (tmp_path / "demo/plots" / name).is_file()
    assert (tmp_path / "demo/checkpoints/step_000002/model/model.safetensors").is_file()
    assert (tmp_path / "demo/world/corpus.jsonl").is_file()
