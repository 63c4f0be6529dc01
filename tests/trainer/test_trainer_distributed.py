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


def test_a_cuda_device_is_resolved_with_an_index(monkeypatch):
    """``trainer.device=cuda`` (and ``auto`` on a GPU) becomes an indexed device before it is made current:
    torch.cuda.set_device refuses ``cuda`` alone (found by the GPU check on an H200). The CUDA calls are
    stood in for here: this machine has no GPU (scripts/gpu-check.sh runs the real path)."""
    from searchr1.trainer import distributed

    made_current = []

    def set_device(device):
        if isinstance(device, torch.device) and device.index is None:  # as torch does
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        made_current.append(device)

    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert distributed.resolve_device("cuda") == torch.device("cuda", 2)
    assert distributed.resolve_device("auto") == torch.device("cuda", 2)
    assert distributed.resolve_device("cuda:1") == torch.device("cuda", 1)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert distributed.resolve_device("cuda") == torch.device("cuda", 3)  # torchrun: this rank's GPU
    assert made_current == [torch.device("cuda", i) for i in (2, 2, 1, 3)]
    assert distributed.resolve_device("cpu") == torch.device("cpu") and len(made_current) == 4
