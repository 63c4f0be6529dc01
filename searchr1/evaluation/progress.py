"""What ``searchr1 eval`` shows while it runs: progress on stderr, and search failures as they start.

One ``Monitor`` serves a whole run. It listens to the engine's tokens (``on_tokens``, once per
decoding step), so it can show a heartbeat while a batch decodes; it wraps the retriever, so it sees
a failing search at once; and it reads each finished batch's records. The first failed search
is reported in one warning line with its cause; later ones are counted (summary and tables).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO


class Monitor:
    """Progress display and search-failure watch for ``searchr1 eval`` (see the module docstring)."""

    def __init__(self, stream: TextIO | None = None, interval_s: float | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = interval_s if interval_s is not None else (0.5 if self.tty else 30.0)
        self.mode = ""
        self.done = 0
        self.total = 0
        self.steps = 0
        self.searches = 0
        self.failures = 0
        """Failed searches of this mode's finished trajectories (a retry that worked is no failure)."""
        self.warned = False
        self._t0 = time.monotonic()
        self._last = 0.0

    # -- the run -------------------------------------------------------------------------------

    def start(self, mode: str, done: int, total: int) -> None:
        """A mode begins (``done`` questions already on disk from an earlier run)."""
        self.mode, self.done, self.total = mode, done, total
        self.steps = self.searches = self.failures = 0
        self._t0 = time.monotonic()
        resumed = f" ({done} already done, resuming)" if done else ""
        self._line(f"[eval {mode}] {total} questions{resumed}", final=True)

    def batch(self, progress: Any) -> None:
        """After each batch is on disk (``evaluate``'s ``on_batch``)."""
        self.done = progress.done
        for rec in progress.records:
            n = int(rec.get("search_failures", 0))
            if n:
                self.failures += n
                errors = rec.get("search_errors") or ["unknown cause"]
                self.warn(f"{errors[0]} (question {rec.get('id')}, {rec.get('data_source')})")
        self._line(self._status(), final=not self.tty)

    def finish(self) -> None:
        """The mode is complete: its last status line stays on screen."""
        self._line(self._status(), final=True)

    def warn(self, cause: str) -> None:
        """The first search failure, in one line; later ones are only counted."""
        if self.warned:
            return
        self.warned = True
        self._line(
            f"warning: search failing: {cause}; searches are retried (rollout.search_retries), those that "
            "still fail are counted in the tables, and eval exits with status 3 unless "
            "--tolerate-search-failures",
            final=True,
        )

    # -- the engine's token listener: a heartbeat while a batch decodes ----------------------------

    def on_tokens(self, tokens: Sequence[Any]) -> None:
        """Called with each decoding step's new tokens (``RolloutEngine.generate(on_tokens=)``)."""
        self.steps += 1
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._line(self._status(active=len(tokens)), final=not self.tty)

    # -- the retriever: a search that raises is seen at once ------------------------------------

    def wrap(self, retriever: Any) -> _WatchedRetriever:
        return _WatchedRetriever(retriever, self)

    # -- display --------------------------------------------------------------------------------

    def _status(self, active: int | None = None) -> str:
        parts = [f"[eval {self.mode}] {self.done}/{self.total} questions"]
        if active is not None:
            parts.append(f"decoding {active} rows, step {self.steps}")
        if self.searches:
            parts.append(f"{self.searches} searches")
        if self.failures:
            parts.append(f"{self.failures} failed")
        parts.append(f"{time.monotonic() - self._t0:.0f} s")
        return " | ".join(parts)

    def _line(self, text: str, final: bool) -> None:
        self._last = time.monotonic()
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


class _WatchedRetriever:
    """A retriever that tells its monitor about every search call and the first one that raises."""

    def __init__(self, retriever: Any, monitor: Monitor) -> None:
        self.retriever = retriever
        self.monitor = monitor

    def search(self, queries: list[str], topk: int) -> list[list[Any]]:
        self.monitor.searches += len(queries)
        try:
            return self.retriever.search(queries, topk)
        except Exception as exc:
            self.monitor.warn(f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
            raise

    def close(self) -> None:
        if hasattr(self.retriever, "close"):
            self.retriever.close()
