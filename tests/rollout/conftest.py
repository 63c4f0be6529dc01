"""Fixtures of the rollout tests: the tiny model loaded through the real loading path."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny(tiny_model_dir):
    """(model, tokenizer) from the tiny Hugging Face folder, fp32, eval mode."""
    from searchr1.models import load_model, load_tokenizer

    model = load_model(tiny_model_dir, dtype="float32").eval()
    return model, load_tokenizer(tiny_model_dir)


@pytest.fixture(autouse=True)
def _rollout_tests_use_one_thread(one_thread):
    """Every rollout test runs the tiny model on one thread (see tests/conftest.py::one_thread)."""
