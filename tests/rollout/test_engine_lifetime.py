"""The vLLM server's lifetime without vLLM: a stand-in server (``stand_in_server.py``: a child process in its
group like vLLM's engine core, optionally deaf to SIGTERM or still loading) started by the engine's own
``start_server`` from a stand-in trainer (``stand_in_trainer.py``) that is then killed with SIGKILL. Its
watchdog stops the server's whole process group (SIGKILL when SIGTERM is not enough) and removes the weights
folder, within a bounded time and without any later command, whichever thread started the server; the
kernel's death signal is set only from the main thread; ``stop()`` gets a stuck group down; a watchdog
signals only the group it was given; the shared memory a group killed with SIGKILL left in /dev/shm is
removed, what a live process holds is not. The real server: tests/rollout/test_vllm_engine.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from searchr1.rollout import vllm_server, watchdog

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs Linux /proc")

HERE = Path(__file__).parent
GONE_WITHIN_S = 30.0
"""The bound on how long a killed trainer's server group and weights folder may outlive it (the stand-in's
grace period before SIGKILL is 2 s)."""


def _wait_for(what, timeout_s: float, describe: str):
    deadline = time.monotonic() + timeout_s
    while not (value := what()):
        assert time.monotonic() < deadline, describe
        time.sleep(0.05)
    return value


def _status(path: Path) -> tuple[int, int, int, Path]:
    """(server pid, its child's pid, its death signal, its shared memory) as the stand-in server reports
    them."""
    text = _wait_for(
        lambda: path.is_file() and path.read_text().strip(), 60, "the stand-in server did not start"
    )
    leader, child, death, segment = text.split()
    return int(leader), int(child), int(death), Path(segment)


def _kill_trainer(tmp_path: Path, *flags: str) -> dict:
    """Start the stand-in trainer with ``flags``, kill it with SIGKILL once its server runs (and answers,
    unless --loading), and measure how long its server group and weights folder outlive it."""
    status, log = tmp_path / "status", tmp_path / "trainer.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    with log.open("w") as err:
        trainer = subprocess.Popen(
            [sys.executable, str(HERE / "stand_in_trainer.py"), str(tmp_path), str(status), *flags],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env, text=True,
        )  # fmt: skip
    try:
        folder = Path(json.loads(trainer.stdout.readline())["folder"])
        leader, child, death, segment = _status(status)
        if "--loading" not in flags:
            assert trainer.stdout.readline().strip() == "ready", log.read_text()
        assert folder.is_dir() and sorted(watchdog.group_members(leader)) == sorted([leader, child])
        assert segment.is_file()
        time.sleep(3 * watchdog.RESCAN_S)  # the watchdog has read which shared memory the group holds
    finally:
        trainer.kill()  # SIGKILL: nothing of the trainer runs after it
        trainer.wait()
    killed = time.monotonic()
    _wait_for(lambda: not watchdog.group_members(leader) and not folder.exists() and not segment.exists(),
              GONE_WITHIN_S, f"the server group, its shared memory or the weights folder outlived the trainer "
              f"by {GONE_WITHIN_S:g} s")  # fmt: skip
    gone_s = time.monotonic() - killed
    said = _wait_for(lambda: [x for x in log.read_text().splitlines() if x.startswith("searchr1 watchdog:")], 10,
                     "the watchdog said nothing")  # fmt: skip
    return {"death_signal": death, "gone_s": gone_s, "said": said, "folder": folder, "leader": leader}


@pytest.mark.parametrize(
    ("flags", "how"),
    [
        ((), None),  # at rest: the kernel's SIGTERM and the watchdog's race to stop it
        (("--stuck",), "SIGTERM, SIGKILL after 2 s"),  # deaf to SIGTERM, it and its child
        # killed while start_server waits for /health:
        (("--loading", "--stuck"), "SIGTERM, SIGKILL after 2 s"),
        # the kernel's SIGTERM makes it kill its child, the segment's only holder, before the watchdog could
        # look: what the watchdog read while the group ran is removed
        (("--reloading",), "SIGTERM, SIGKILL after 2 s"),
    ],
    ids=["at-rest", "stuck", "loading", "reloading"],
)
def test_a_killed_trainer_leaves_no_server_and_no_weights_folder(flags, how, tmp_path):
    out = _kill_trainer(tmp_path, *flags)
    assert out["death_signal"] == signal.SIGTERM  # started from the main thread: the kernel's signal too
    assert len(out["said"]) == 1 and out["said"][0].endswith(f"removed {out['folder']}")
    if how is not None:  # SIGTERM alone could not stop it: only the watchdog's SIGKILL did, and then the
        # watchdog removed the shared memory the group could not remove itself
        assert f"process group {out['leader']} ({how}" in out["said"][0]
        assert "; 1 MB of shared memory it left freed" in out["said"][0]
    print(f"{'+'.join(flags) or 'at rest'}: group and folder gone {out['gone_s']:.2f} s after the SIGKILL")


def test_a_server_started_on_a_worker_thread_outlives_the_thread_and_not_the_trainer(tmp_path):
    """PR_SET_PDEATHSIG fires when the thread that forked the server ends: from a worker thread it would stop
    the server of a trainer that still runs, so it is not set there, and the watchdog alone stops it."""
    out = _kill_trainer(tmp_path, "--thread")  # the trainer saw the server answer after the thread ended
    assert out["death_signal"] == 0
    assert len(out["said"]) == 1 and "SIGTERM, gone in" in out["said"][0]
    print(f"worker thread: group and folder gone {out['gone_s']:.2f} s after the SIGKILL")


def _stand_in_launch(tmp_path: Path, *flags: str):
    sys.path.insert(0, str(HERE))
    try:
        from stand_in_trainer import StandInLaunch
    finally:
        sys.path.remove(str(HERE))
    return StandInLaunch(tmp_path / "status", list(flags))


def test_stop_takes_down_a_stuck_server_group(tmp_path):
    server = vllm_server.start_server(_stand_in_launch(tmp_path, "--stuck"), log_dir=tmp_path)
    leader, child, _, segment = _status(tmp_path / "status")
    assert sorted(watchdog.group_members(leader)) == sorted([leader, child]) and segment.is_file()
    t0 = time.monotonic()
    server.stop(grace_s=1.0)
    assert watchdog.group_members(leader) == []  # the child too, deaf to SIGTERM as it is
    assert not segment.exists()  # the shared memory that SIGKILL kept it from removing
    assert server.failure() is None and not server.healthy(timeout=1)
    print(f"stop(grace_s=1) of a stuck group: {time.monotonic() - t0:.2f} s")


def test_stop_removes_the_shared_memory_of_a_group_killed_before_it(tmp_path):
    """A server whose whole group was killed with SIGKILL (the OOM killer, a user's kill) could not unlink its
    shared memory, and no process of it is left to say which files it held: ``stop()`` removes what the
    group held when it became healthy."""
    server = vllm_server.start_server(_stand_in_launch(tmp_path), log_dir=tmp_path)
    leader, _, _, segment = _status(tmp_path / "status")
    assert str(segment) in server.shm
    os.killpg(leader, signal.SIGKILL)
    assert watchdog.wait_gone(leader, 10) and segment.is_file()
    server.stop()
    assert not segment.exists()


def test_without_prctl_one_warning_and_no_death_signal(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(vllm_server, "_prctl", lambda: (None, "no prctl in this test"))
    monkeypatch.setattr(vllm_server, "_warned_no_prctl", False)
    for attempt in ("a", "b"):
        (tmp_path / attempt).mkdir()
        server = vllm_server.start_server(_stand_in_launch(tmp_path / attempt), log_dir=tmp_path / attempt)
        try:
            assert _status(tmp_path / attempt / "status")[2] == 0
        finally:
            server.stop()
    warnings = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning:")]
    assert warnings == [
        "warning: no death signal for the vLLM server (no prctl in this test): if this process is killed, its "
        "watchdog alone stops the server"
    ]


def test_prctl_is_found_before_the_fork():
    prctl, why = vllm_server._prctl()
    assert prctl is not None, why
    assert vllm_server._death_signal() is not None  # the main thread: the death signal is set


# -- the watchdog on its own ---------------------------------------------------------------------------------


def _session_leader() -> subprocess.Popen:
    """A process leading a group of its own (as the server does)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)


def test_the_watchdog_signals_only_the_group_it_was_given(tmp_path, capsys):
    proc = _session_leader()
    try:
        start = watchdog.process_start(proc.pid)
        assert start is not None
        other = tmp_path / "kept"
        other.mkdir()
        # a group id whose leader started at another time is another group (a reused id): left alone
        lines = [f"group {proc.pid} {start + 1} 1\n".encode(), f"folder {other}\n".encode(),
                 f"release-folder {other}\n".encode()]  # fmt: skip
        assert watchdog.watch(iter(lines), owner=1) == 0
        assert proc.poll() is None and other.is_dir()
        assert capsys.readouterr().err == ""  # nothing done, nothing said
        # the group it was given, with the leader's start time: stopped; a folder still registered: removed
        doomed = tmp_path / "doomed"
        doomed.mkdir()
        lines = [f"group {proc.pid} {start} 1\n".encode(), f"folder {doomed}\n".encode()]
        watchdog.watch(iter(lines), owner=1)
        assert proc.wait(timeout=5) == -signal.SIGTERM and not doomed.exists()
        said = capsys.readouterr().err
        assert said.startswith("searchr1 watchdog: process 1 ended without cleaning up: stopped the vLLM")
        assert f"removed {doomed}" in said
    finally:
        proc.kill()
        proc.wait()


def test_a_released_group_is_left_running_when_the_owner_ends(tmp_path):
    proc = _session_leader()
    wd = watchdog.Watchdog.start()
    try:
        wd.guard_group(proc.pid, 1.0)
        wd.release_group(proc.pid)
        folder = tmp_path / "w"
        folder.mkdir()
        wd.guard_folder(folder)
        wd.close()  # as this process's end would: EOF
        assert wd.process.returncode == 0
        assert proc.poll() is None and not folder.exists()
    finally:
        proc.kill()
        proc.wait()


def test_the_watchdog_removes_shared_memory_whose_holders_died_before_their_trainer(tmp_path, capsys):
    """The segment's only holder in the group dies (killed) while the trainer still runs, then the trainer
    ends: the watchdog read the segment while the holder ran, and removes it."""
    segment = Path(f"/dev/shm/searchr1-test-{os.getpid()}-held")
    segment.write_bytes(b"\0" * 2_000_000)
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import mmap, time; f = open({str(segment)!r}, 'r+b'); m = mmap.mmap(f.fileno(), 0)"
         "; print('mapped', flush=True); time.sleep(600)"],
        start_new_session=True, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "mapped\n"
        start = watchdog.process_start(holder.pid)

        def lines():
            yield f"group {holder.pid} {start} 1\n".encode()
            time.sleep(0.5)  # a few rescans while it runs
            holder.kill()
            holder.wait()
            assert segment.is_file()  # SIGKILL left it
            # EOF: the trainer ends

        assert watchdog.watch(lines(), owner=1, rescan_s=0.1) == 0
        assert not segment.exists()
        said = capsys.readouterr().err
        assert f"process group {holder.pid} was already gone; 2 MB of shared memory it left freed" in said
    finally:
        holder.kill()
        holder.wait()
        segment.unlink(missing_ok=True)


def test_shared_memory_a_live_process_holds_is_kept(tmp_path):
    """Only what nobody holds is removed, whoever held it before."""
    path = Path(f"/dev/shm/searchr1-test-{os.getpid()}")
    path.write_bytes(b"x" * 1000)
    try:
        with path.open("rb"):
            assert str(path) in watchdog.shm_held([os.getpid()])
            assert watchdog.remove_leaked_shm({str(path)}) == 0 and path.is_file()
        assert watchdog.remove_leaked_shm({str(path)}) == 1000 and not path.exists()
        outside = tmp_path / "not-in-shm"
        outside.write_bytes(b"x")
        assert watchdog.remove_leaked_shm({str(outside)}) == 0 and outside.is_file()
    finally:
        path.unlink(missing_ok=True)
