"""The weights folders a run writes for a vLLM server (in /dev/shm): named after their owner process, and
freed by the next ``searchr1`` command (or engine start) once that process is gone, SIGKILL included, with
one line saying what was freed. Folders of live processes, other names and reused pids are told apart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from searchr1.rollout import scratch

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs Linux /proc")

OWNER = """
import sys
from pathlib import Path
from searchr1.rollout.scratch import make_weights_dir
folder = make_weights_dir(Path(sys.argv[1]))
(folder / "model.safetensors").write_bytes(b"x" * 3_000_000)
print(folder, flush=True)
sys.stdin.read()  # until killed
"""


def _killed_owner(root: Path) -> Path:
    """A weights folder whose owner process was killed with SIGKILL (it never cleaned up)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    folder = Path(proc.stdout.readline().strip())
    assert folder.is_dir() and folder.name.startswith(f"{scratch.PREFIX}{proc.pid}-")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return folder


def test_a_killed_owners_folder_is_freed_with_one_line(tmp_path, capsys):
    mine = scratch.make_weights_dir(tmp_path)  # this process runs: kept
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
