"""The weights folders a run writes for a vLLM server (in /dev/shm): put where the weights fit (a small or full
/dev/shm sends them to the temp folder, one line says which), named after their owner process and locked by
it, and freed by the next ``searchr1`` command (or engine start) once that process is gone, SIGKILL included,
with one line saying what was freed. Folders of live processes (in this pid namespace or another), other
names and reused pids are told apart. (The watchdog frees them sooner: tests/rollout/test_engine_lifetime.py.)"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from searchr1.rollout import scratch

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs Linux /proc")

OWNER = """
import sys
from pathlib import Path
from searchr1.rollout.scratch import make_weights_dir
folder = make_weights_dir(0, [Path(sys.argv[1])], quiet=True)
(folder / "model.safetensors").write_bytes(b"x" * 3_000_000)
print(folder, flush=True)
sys.stdin.read()  # until killed
"""


def _owner(root: Path, *wrapper: str) -> tuple[subprocess.Popen, Path]:
    """A live process (run through ``wrapper``, if any) that made a weights folder in ``root``."""
    proc = subprocess.Popen(
        [*wrapper, sys.executable, "-c", OWNER, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    folder = Path(proc.stdout.readline().strip())
    assert folder.is_dir(), f"the owner did not start (through {wrapper})"
    return proc, folder


def _killed_owner(root: Path) -> Path:
    """A weights folder whose owner process was killed with SIGKILL (it never cleaned up)."""
    proc, folder = _owner(root)
    assert folder.name.startswith(f"{scratch.PREFIX}{proc.pid}-")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return folder


def test_a_killed_owners_folder_is_freed_with_one_line(tmp_path, capsys):
    mine = scratch.make_weights_dir(0, [tmp_path], quiet=True)  # this process runs: kept
    other = tmp_path / "searchr1-vllm-weights-notapid"  # not a name the sweep makes: kept
    other.mkdir()
    orphan = _killed_owner(tmp_path)
    assert scratch.sweep_orphans([tmp_path]) == (1, 3_000_000)
    err = capsys.readouterr().err
    assert err == f"freed 3 MB in {tmp_path}: 1 vLLM weights folder left by killed runs\n"
    assert not orphan.exists() and mine.is_dir() and other.is_dir()
    assert scratch.sweep_orphans([tmp_path]) == (0, 0)  # nothing left to free: silent
    assert capsys.readouterr().err == ""


def test_a_reused_pid_does_not_keep_a_folder(tmp_path):
    start = scratch.process_start(os.getpid())
    assert start is not None and start > 0
    reused = tmp_path / f"{scratch.PREFIX}{os.getpid()}-{start + 1}-abc"  # this pid, another process's start
    alive = tmp_path / f"{scratch.PREFIX}{os.getpid()}-{start}-abc"
    reused.mkdir()
    alive.mkdir()
    assert scratch.sweep_orphans([tmp_path], quiet=True) == (1, 0)
    assert not reused.exists() and alive.is_dir()


def test_the_next_searchr1_command_frees_them(tmp_path, monkeypatch, capsys):
    from searchr1.cli import main

    orphan = _killed_owner(tmp_path)
    monkeypatch.setattr(scratch, "scratch_roots", lambda: [tmp_path])
    assert main(["train", "--print-config"]) == 0
    assert not orphan.exists()
    assert "freed 3 MB in" in capsys.readouterr().err


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_folder_whose_lock_is_held_is_kept_whatever_its_name_says(tmp_path):
    """As a live run's folder seen from another pid namespace: the pid in its name is nobody here, but its
    owner holds the lock; once the owner dies the lock is free and the folder goes."""
    folder = tmp_path / f"{scratch.PREFIX}{_dead_pid()}-123-abc"
    folder.mkdir()
    (folder / scratch.LOCK_NAME).touch()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()",
         str(folder / scratch.LOCK_NAME)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert scratch.sweep_orphans([tmp_path], quiet=True) == (0, 0)
        assert folder.is_dir()
    finally:
        holder.kill()
        holder.wait()
    assert scratch.sweep_orphans([tmp_path], quiet=True) == (1, 0)
    assert not folder.exists()


def test_a_live_run_in_another_pid_namespace_keeps_its_folder(tmp_path):
    """The real thing where this machine allows it: the owner runs in a pid namespace of its own (its pid
    there is 1, which here is init, started at another time), sharing the folder's file system."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare command")
    probe = subprocess.run([unshare, "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"no new pid namespace here (unshare: {probe.stderr.decode().strip()})")
    proc, folder = _owner(tmp_path, unshare, "--pid", "--fork", "--mount-proc", "--kill-child")
    try:
        pid, start = (int(x) for x in scratch._NAME.match(folder.name).groups())
        assert pid != proc.pid and scratch._owner_gone(pid, start)  # its pid says nothing here
        assert scratch.sweep_orphans([tmp_path], quiet=True) == (0, 0)
        assert folder.is_dir()
    finally:
        proc.kill()  # unshare, and with it (--kill-child) the owner
        proc.wait()
    deadline = time.monotonic() + 30
    while scratch.sweep_orphans([tmp_path], quiet=True) == (0, 0):  # the lock goes when the owner has exited
        assert time.monotonic() < deadline, "the folder outlived its owner's namespace"
        time.sleep(0.05)
    assert not folder.exists()


def _free(mapping: dict[Path, int]):
    return lambda root: mapping[root]


def test_weights_go_where_they_fit_and_one_line_says_which(tmp_path, capsys):
    shm, tmp = tmp_path / "shm", tmp_path / "tmp"
    shm.mkdir()
    tmp.mkdir()
    need = 326_000_000
    folder = scratch.make_weights_dir(need, [shm, tmp], free=_free({shm: 64_000_000, tmp: 10**11}))
    assert folder.parent == tmp and (folder / scratch.LOCK_NAME).is_file()
    assert capsys.readouterr().err == (
        f"vllm: weights folder {folder} ({shm} has 64 MB free, 326 MB of weights, 100,000 MB free there)\n"
    )
    folder = scratch.make_weights_dir(need, [shm, tmp], free=_free({shm: 10**10, tmp: 10**11}))
    assert folder.parent == shm
    assert capsys.readouterr().err == f"vllm: weights folder {folder} (326 MB of weights, 10,000 MB free there)\n"
    # the headroom counts: exactly the weights' size is not enough
    folder = scratch.make_weights_dir(need, [shm, tmp], free=_free({shm: need, tmp: 10**11}), quiet=True)
    assert folder.parent == tmp
    with pytest.raises(scratch.ScratchSpaceError) as err:
        scratch.make_weights_dir(need, [shm, tmp], free=_free({shm: 1_000_000, tmp: 2_000_000}))
    assert str(err.value) == (
        f"no room for the vLLM weights (326 MB): free space {shm} 1 MB, {tmp} 2 MB; free some, or set "
        "rollout.vllm.weights_dir to a folder with room"
    )


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MB tmpfs: a container's small /dev/shm (needs the right to mount: root, here)."""
    mount = tmp_path / "shm"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True,
                          text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); the injected sizes above test the same")
    yield mount
    subprocess.run(["umount", "--lazy", str(mount)], check=True)  # lazy: a failed test may leave a file open


def test_a_small_tmpfs_sends_the_weights_to_disk_and_holds_one_copy_at_a_time(small_tmpfs, tmp_path, capsys):
    from searchr1.rollout.vllm import weights_bytes, write_safetensors

    state = {"w": torch.ones(625_000)}  # 2.5 MB in float32: fits in 4 MB once, not twice
    need = weights_bytes(state, "float32")
    assert need == 2_500_000
    big = {"w": torch.ones(1_250_000)}  # 5 MB: does not fit
    folder = scratch.make_weights_dir(weights_bytes(big, "float32"), [small_tmpfs, tmp_path])
    assert folder.parent == tmp_path and f"{small_tmpfs} has 4 MB free" in capsys.readouterr().err
    scratch.remove_weights_dir(folder)
    folder = scratch.make_weights_dir(need, [small_tmpfs, tmp_path], quiet=True)
    assert folder.parent == small_tmpfs
    for value in (1.0, 2.0):  # the second write replaces the first: the old file goes before the new is written
        write_safetensors({"w": torch.full((625_000,), value)}, folder, "float32")
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(folder / "model.safetensors"))["w"], torch.full((625_000,), 2.0))
    with pytest.raises(scratch.ScratchSpaceError) as err:
        write_safetensors(big, folder, "float32")  # a clear line, not "No space left on device"
    assert str(err.value).startswith(f"no room for the vLLM weights (5 MB) in {folder}: ")
    scratch.remove_weights_dir(folder)
    assert not folder.exists()
