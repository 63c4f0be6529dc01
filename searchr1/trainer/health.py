"""The collapse guard: per-step signals of a policy that is collapsing, and one warning per pattern.

GRPO runs on search tasks collapse in a few recognisable ways (Search-R1's issues #88 / #92; Deng et
al. 2025, "On GRPO Collapse in Search-R1", arXiv 2512.04220): the policy stops closing its answer
tags while its entropy falls, it stops searching, it stops writing the valid structure, or it turns
deterministic so that every group's samples score alike and no advantage is left. Each step the
trainer hands its metrics to a ``CollapseMonitor``, which keeps a short trailing mean of

    entropy          actor/entropy           (mean token entropy of the update)
    closed answers   rollout/answered        (share of trajectories ending in a closed </answer>)
    valid format     rollout/valid_format    (share with Search-R1's valid structure)
    searches         rollout/searches        (searches per trajectory)
    flat groups      rollout/flat_groups     (share of groups whose rewards are all equal)

and compares it with the best trailing mean seen so far in the run:

    answers_unclosed   closed answers < drop * best  (best >= min_best)  and entropy < drop * first entropy
    searching_stopped  searches < drop * best        (best >= min_best)
    format_lost        valid format < drop * best    (best >= min_best)
    no_signal          flat groups >= flat_share, after a step that had less, and entropy < drop * first

A pattern that shows is written once (the signal, the step, the values) and every step it holds
sets ``health/<pattern>`` = 1 and ``health/collapse`` = 1 in the metrics, so plots and the report show
where it began. The guard only warns: ``trainer.keep_best`` keeps the best validated policy.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

SIGNALS = {
    "entropy": "actor/entropy",
    "answered": "rollout/answered",
    "valid_format": "rollout/valid_format",
    "searches": "rollout/searches",
    "flat_groups": "rollout/flat_groups",
}
"""Signal name -> the metric it is read from."""

PATTERNS = ("answers_unclosed", "searching_stopped", "format_lost", "no_signal")


@dataclass
class CollapseAlert:
    """A collapse pattern seen at ``step`` (the first step it held)."""

    pattern: str
    step: int
    message: str


@dataclass
class CollapseMonitor:
    """Trailing means of the signals against their best so far; see the module docstring."""

    window: int = 2
    """Steps in the trailing mean (smooths the noise of a small batch)."""
    drop: float = 0.5
    """A signal has collapsed when its trailing mean falls below ``drop`` times its best."""
    min_best: float = 0.2
    """A signal whose best never reached this is not watched (a run that never searched cannot stop)."""
    flat_share: float = 0.9
    """no_signal: this share of groups (or more) with all rewards equal."""
    history: dict[str, deque[float]] = field(default_factory=dict)
    best: dict[str, float] = field(default_factory=dict)
    first_entropy: float | None = None
    min_flat: float | None = None
    alerts: list[CollapseAlert] = field(default_factory=list)
    """Every pattern that has shown, once each, in order."""

    def _mean(self, name: str) -> float | None:
        values = self.history.get(name)
        return sum(values) / len(values) if values else None

    def observe(self, step: int, metrics: dict[str, float]) -> list[CollapseAlert]:
        """Take one step's metrics; add ``health/*`` entries to them; return the patterns new this step."""
        for name, key in SIGNALS.items():
            if key in metrics:
                self.history.setdefault(name, deque(maxlen=self.window)).append(float(metrics[key]))
        means = {name: self._mean(name) for name in SIGNALS}
        if self.first_entropy is None and means["entropy"] is not None:
            self.first_entropy = means["entropy"]
        entropy_low = (
            means["entropy"] is not None
            and self.first_entropy is not None
            and means["entropy"] < self.drop * self.first_entropy
        )
        active = {}
        for pattern, name, needs_low_entropy in (
            ("answers_unclosed", "answered", True),
            ("searching_stopped", "searches", False),
            ("format_lost", "valid_format", False),
        ):
            value, best = means[name], self.best.get(name)
            if value is None:
                continue
            fell = best is not None and best >= self.min_best and value < self.drop * best
            if fell and (entropy_low or not needs_low_entropy):
                active[pattern] = f"{SIGNALS[name]} {value:.2f}, best {best:.2f}"
            self.best[name] = value if best is None else max(best, value)
        flat = metrics.get(SIGNALS["flat_groups"])
        if flat is not None:
            if self.min_flat is not None and self.min_flat < self.flat_share <= flat and entropy_low:
                active["no_signal"] = f"{SIGNALS['flat_groups']} {flat:.2f} (all rewards equal in the group)"
            self.min_flat = flat if self.min_flat is None else min(self.min_flat, flat)
        for pattern in PATTERNS:
            metrics[f"health/{pattern}"] = float(pattern in active)
        metrics["health/collapse"] = float(bool(active))
        seen = {a.pattern for a in self.alerts}
        new = []
        for pattern, detail in active.items():
            if pattern in seen:
                continue
            entropy = (
                f"; entropy {means['entropy']:.3f} (first {self.first_entropy:.3f})"
                if means["entropy"]
                else ""
            )
            alert = CollapseAlert(
                pattern,
                step,
                f"warning: possible collapse at step {step}: {pattern.replace('_', ' ')} ({detail}{entropy}). "
                "trainer.keep_best=val_em keeps the best validated policy; a lower actor_lr or "
                "algorithm.llds_coef may help.",
            )
            self.alerts.append(alert)
            new.append(alert)
        return new

    def state_dict(self) -> dict:
        return {
            "history": {k: list(v) for k, v in self.history.items()},
            "best": dict(self.best),
            "first_entropy": self.first_entropy,
            "min_flat": self.min_flat,
            "alerts": [a.__dict__ for a in self.alerts],
        }

    def load_state_dict(self, state: dict) -> None:
        self.history = {k: deque(v, maxlen=self.window) for k, v in state.get("history", {}).items()}
        self.best = dict(state.get("best", {}))
        self.first_entropy = state.get("first_entropy")
        self.min_flat = state.get("min_flat")
        self.alerts = [CollapseAlert(**a) for a in state.get("alerts", [])]


def flat_group_share(
    scores: list[float], group_ids: list[int], tol: float = 1e-9, signal: Collection[int] = ()
) -> float:
    """Share of groups whose rewards are all equal (within ``tol``): groups with no advantage left.
    Groups in ``signal`` never count as flat (their search turns' step rewards differ)."""
    groups: dict[int, list[float]] = {}
    for score, gid in zip(scores, group_ids, strict=True):
        groups.setdefault(gid, []).append(float(score))
    if not groups:
        return 0.0
    flat = sum(max(v) - min(v) <= tol and g not in signal for g, v in groups.items())
    return flat / len(groups)
