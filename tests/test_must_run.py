"""A test that cannot run skips on a developer's machine and fails in CI (``CI=true``): ``must_run``."""

from __future__ import annotations

import pytest
from must_run import skip_or_fail


def _outcome(reason: str) -> BaseException:
    """What ``skip_or_fail`` raised: a skip or a failure (caught either way, so that a wrong one fails here
    instead of turning this test into a skip)."""
    with pytest.raises((pytest.skip.Exception, pytest.fail.Exception)) as info:
        skip_or_fail(reason)
    return info.value


@pytest.mark.parametrize("ci", ["", "false", "0"])
def test_outside_ci_it_skips(ci, monkeypatch):
    monkeypatch.setenv("CI", ci)
    outcome = _outcome("the model is missing")
    assert isinstance(outcome, pytest.skip.Exception) and outcome.msg == "the model is missing"


@pytest.mark.parametrize("ci", ["true", "TRUE", "1"])
def test_in_ci_it_fails_with_the_reason(ci, monkeypatch):
    monkeypatch.setenv("CI", ci)
    outcome = _outcome("the model is missing")
    assert isinstance(outcome, pytest.fail.Exception)
    assert outcome.msg.startswith("the model is missing (CI=true: this test must run in CI")
