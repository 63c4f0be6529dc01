"""Shared fixtures: seeded RNGs, offline hub, a tiny model folder written by the tests themselves."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

TINY_TEXTS = [
    "Alice Verdan was born in Borvik in 1901. She founded the Quillon Press.",
    "Borvik is a city in Tarnland. The Quillon Press is a publisher based in Borvik.",
    "Question: where was Alice Verdan born? <think> I should search. </think> "
    "<search> Alice Verdan </search> <information> Doc 1(Title: Alice Verdan) born in Borvik "
    "</information> <answer> Borvik </answer>",
] * 40


@pytest.fixture(autouse=True)
def _seed_everything() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from a second thread, and lose a lot on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """A tiny Qwen2-style model + tokenizer saved as a Hugging Face folder (built once per session)."""
    from tinymodel import save_tiny_checkpoint

    out = tmp_path_factory.mktemp("tiny-model")
    return save_tiny_checkpoint(out, TINY_TEXTS, seed=0, vocab_size=512)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``vllm`` start vLLM servers: they run under ``scripts/test.sh --vllm`` (which installs
    .venv-vllm and sets SEARCHR1_VLLM_TESTS=1) and skip, naming that command, everywhere else. A test marked
    ``learning`` must be marked ``slow`` too: statistical tests stay out of the default suite and of CI."""
    unmarked = [i.nodeid for i in items if i.get_closest_marker("learning") and not i.get_closest_marker("slow")]
    if unmarked:
        raise pytest.UsageError(f"marked learning but not slow (add @pytest.mark.slow): {', '.join(unmarked)}")
    if os.environ.get("SEARCHR1_VLLM_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="vLLM engine test: run `scripts/test.sh --vllm` (installs .venv-vllm)")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)
