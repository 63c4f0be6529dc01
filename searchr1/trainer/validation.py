"""Which validation questions a run validates on, and the validation metrics of its greedy rollouts.

``trainer.val_max_samples`` questions (0: all), in file order; with ``trainer.val_balance_kinds`` as many
single-hop as multi-hop ones (each kind's first), so that ``val/em_by_kind``, the mean of the kinds' EMs
(``trainer.keep_best=val_em_by_kind``), weighs a two-hop question as much as a single-hop one whatever the
split holds. Metrics: ``val/em``, ``val/sub_em``, ``val/f1``, ``val/searches``, ``val/turns`` over all
questions; ``val/<source>/{em,f1,searches,turns}`` per data source; ``val/<kind>/{em,searches}`` per kind
(``single-hop``, ``multi-hop``) and ``val/em_by_kind``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from searchr1.data.formats import sample_kind


def validation_samples(samples: Sequence[Any], limit: int, balance_kinds: bool) -> list[Any]:
    """The questions validated on (see the module docstring); ``limit`` 0: all."""
    samples = list(samples)
    limit = limit or len(samples)
    if not balance_kinds:
        return samples[:limit]
    by_kind: dict[str, list[Any]] = {}
    for sample in samples:
        by_kind.setdefault(sample_kind(sample), []).append(sample)
    each = min([limit // max(1, len(by_kind)), *(len(v) for v in by_kind.values())])
    return [s for kind in sorted(by_kind) for s in by_kind[kind][:each]]


def validation_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The metrics of the validation rows ``{"source", "kind", "em", "sub_em", "f1", "searches", "turns"}``."""
    out: dict[str, float] = {}
    for field, prefix_keys in (("source", ("em", "f1", "searches", "turns")), ("kind", ("em", "searches"))):
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault(r[field], []).append(r)
        for name, rs in sorted(groups.items()):
            for key in prefix_keys:
                out[f"val/{name}/{key}"] = sum(r[key] for r in rs) / len(rs)
    for key in ("em", "sub_em", "f1", "searches", "turns"):
        out[f"val/{key}"] = sum(r[key] for r in rows) / max(1, len(rows))
    kinds = sorted({r["kind"] for r in rows})
    out["val/em_by_kind"] = sum(out[f"val/{k}/em"] for k in kinds) / max(1, len(kinds))
    return out
