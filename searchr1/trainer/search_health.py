"""Search failures during training: a warning when they start, a stop when they dominate.

A failed search (backend down, timeout after the retries) becomes an observation that says so and
the run goes on (:mod:`searchr1.rollout.search`). That is right for a blip and wrong for an outage:
the policy would learn on a world without search. Each step's failures and searches feed
:class:`SearchFailureMonitor`:

* the first failing step (or the first after ``window`` clean steps) prints one warning line
  with the count and the cause (the first error message of that step);
* once ``window`` steps have been seen, the run stops (checkpoint, non-zero exit) when

      sum(failures over the last window steps) / sum(searches over the last window steps)
          > rollout.max_search_failure_rate

  (``1.0`` never stops: a rate cannot exceed 1).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass
class SearchAlert:
    warning: str | None = None
    """One line to print (failures just started), or None."""
    stop: str | None = None
    """Why the run must stop (the failure rate over the window exceeds the threshold), or None."""


def first_search_error(trajectories: Iterable[Any]) -> str | None:
    """The first failed search's message among ``trajectories`` (``meta['search_errors']``)."""
    for traj in trajectories:
        errors = getattr(traj, "meta", {}).get("search_errors")
        if errors:
            return str(errors[0])
    return None


class SearchFailureMonitor:
    """Watches failures / searches per step; see the module docstring for the rule."""

    def __init__(self, max_rate: float, window: int) -> None:
        self.max_rate = max_rate
        self.window = window
        self._steps: deque[tuple[float, float]] = deque(maxlen=window)
        self._clean_in_a_row = window  # a run starts as if after a long clean stretch
        self.warnings = 0

    def rate(self) -> float:
        """Failed / attempted searches over the last ``window`` steps (0 without searches)."""
        failures = sum(f for f, _ in self._steps)
        searches = sum(s for _, s in self._steps)
        return failures / searches if searches else 0.0

    def observe(
        self, step: int, failures: float, searches: float, cause: Callable[[], str | None]
    ) -> SearchAlert:
        """Record one step. ``cause()`` (called only when a line is written) names the first error."""
        self._steps.append((failures, searches))
        alert = SearchAlert()
        if failures <= 0:
            self._clean_in_a_row += 1
            return alert
        reason = None
        if self._clean_in_a_row >= self.window:
            reason = cause() or "no error message recorded"
            self.warnings += 1
            alert.warning = (
                f"warning: {failures:g} of {searches:g} searches failed at step {step}; the policy sees "
                f"'search failed' observations while this lasts (rollout.max_search_failure_rate="
                f"{self.max_rate:g} over {self.window} steps stops the run). Cause: {reason}"
            )
        self._clean_in_a_row = 0
        if len(self._steps) == self.window and self.rate() > self.max_rate:
            reason = reason or cause() or "no error message recorded"
            alert.stop = (
                f"stopping at step {step}: {self.rate():.0%} of the searches of the last {self.window} steps "
                f"failed, more than rollout.max_search_failure_rate={self.max_rate:g}. Last cause: {reason}. "
                "Check the retrieval backend (retrieval.url / retrieval.index), then resume from the "
                "checkpoint (trainer.resume=auto); rollout.max_search_failure_rate=1.0 never stops."
            )
        return alert
