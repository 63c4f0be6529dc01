"""torch.distributed on CPU (gloo): the update of a 2-process run equals the 1-process update over
the same global batch (loss and weights within 1e-5)."""

from __future__ import annotations

import socket

import distworker
import pytest
import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned(rank: int, world: int, model_dir: str, out: str, port: int, strategy: str) -> None:
    distworker.run(rank, world, model_dir, out, port, strategy)


@pytest.mark.parametrize("strategy", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])
def test_two_ranks_match_one(tiny_model_dir, tmp_path, strategy):
    single, double = tmp_path / "one.pt", tmp_path / "two.pt"
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=_spawned, args=(0, 1, str(tiny_model_dir), str(single), 0, strategy))
    p.start()
    p.join(300)
    assert p.exitcode == 0
    mp.start_processes(_spawned, args=(2, str(tiny_model_dir), str(double), _free_port(), strategy), nprocs=2,
                       start_method="spawn", join=True)  # fmt: skip
    one, two = torch.load(single, weights_only=False), torch.load(double, weights_only=False)
    assert one["skipped"] == two["skipped"] == 0
    for key in (
        "actor/pg_loss",
        "actor/loss",
        "actor/kl_loss",
        "actor/entropy",
        "actor/grad_norm",
        "actor/clipfrac",
    ):
        assert two["metrics"][key] == pytest.approx(one["metrics"][key], abs=1e-5), key
    assert one["metrics"]["actor/clipfrac"] > 0  # two epochs: the second one is off-policy and clips
    changed = 0
    for name, value in one["state"].items():
        torch.testing.assert_close(two["state"][name], value, atol=1e-5, rtol=0, msg=name)
        changed += int(not torch.equal(value, distworker_initial(tiny_model_dir)[name]))
    assert changed > 0


_INITIAL: dict = {}


def distworker_initial(model_dir):
    if "sd" not in _INITIAL:
        from searchr1.models import load_model

        _INITIAL["sd"] = load_model(model_dir).state_dict()
    return _INITIAL["sd"]
