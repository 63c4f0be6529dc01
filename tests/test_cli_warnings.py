"""The command line hides the known-noisy third-party warnings, and only those."""

from __future__ import annotations

import logging
import warnings

import pytest

from searchr1 import cli


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(cli, "_quieted", False)
    monkeypatch.delenv(cli.SHOW_WARNINGS_ENV, raising=False)
    logger = logging.getLogger("transformers.utils.generic")
    before = list(logger.filters)
    yield logger
    logger.filters[:] = before


def test_known_noisy_warnings_are_hidden_others_kept(fresh, caplog):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cli.quiet_third_party_warnings()
        warnings.warn(
            "`past_key_values` is deprecated and will be removed in version 5.40.0",
            FutureWarning,
            stacklevel=1,
        )
        warnings.warn("something else is deprecated", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["something else is deprecated"]
    with caplog.at_level(logging.WARNING):
        fresh.warning("`past_key_values`/`cache_params` are deprecated. Use `cache` instead.")
        fresh.warning("a real problem")
    assert [r.getMessage() for r in caplog.records] == ["a real problem"]


def test_env_shows_everything(fresh, monkeypatch):
    monkeypatch.setenv(cli.SHOW_WARNINGS_ENV, "1")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cli.quiet_third_party_warnings()
        warnings.warn("`past_key_values` is deprecated", FutureWarning, stacklevel=1)
    assert len(seen) == 1
