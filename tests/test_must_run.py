"""A test that cannot run skips on a developer's machine and fails in CI (``CI=true``): ``must_run``."""

from __future__ import annotations

import pytest
from must_run import skip_or_fail


@pytest.mark.parametrize("ci", ["", "false", "0"])
def test_outside_ci_it_skips(ci, monkeypatch):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match=r"^the model is missing$"):
        skip_or_fail("the model is missing")


@pytest.mark.parametrize("ci", ["true", "TRUE", "1"])
def test_in_ci_it_fails_with_the_reason(ci, monkeypatch):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match=r"^the model is missing \(CI=true: this test must run"):
        skip_or_fail("the model is missing")

