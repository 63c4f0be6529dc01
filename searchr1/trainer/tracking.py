"""Metric sinks: metrics.jsonl (always), TensorBoard, Weights & Biases (offline by default), progress bar.

Metric names are namespaced: ``reward/mean``, ``reward/<component>``, ``val/<source>/em``,
``rollout/searches``, ``actor/kl``, ``actor/entropy``, ``actor/clipfrac``, ``critic/vf_loss``,
``timing/rollout``, ``timing/search``, ``timing/update``, ...
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

PROGRESS_KEYS = (
    ("reward/mean", "R"),
    ("warmstart/loss", "loss"),
    ("reward/em", "EM"),
    ("rollout/searches", "srch"),
    ("rollout/search_failure_rate", "srch_fail"),
    ("rollout/response_length", "len"),
    ("actor/kl", "kl"),
    ("actor/entropy", "ent"),
    ("actor/clipfrac", "clip"),
    ("timing/rollout", "t_roll"),
    ("timing/search", "t_srch"),
    ("timing/update", "t_upd"),
)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl (skipping a truncated last line)."""
    rows = []
    path = Path(path)
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class MetricsLogger:
    """Writes each step's metrics to every configured backend (rank 0 only: pass enabled=False elsewhere)."""

    def __init__(
        self,
        out_dir: str | Path,
        backends: list[str],
        enabled: bool = True,
        run_config: dict[str, Any] | None = None,
        wandb_project: str = "searchr1",
        wandb_mode: str = "offline",
        resume_step: int = 0,
    ) -> None:
        self.enabled = enabled
        self.out_dir = Path(out_dir)
        self.jsonl_path = self.out_dir / "metrics.jsonl"
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if resume_step >= 0:
            self._truncate_after(resume_step)
        if "tensorboard" in backends:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.out_dir / "tensorboard"), purge_step=resume_step + 1)
            except ImportError as exc:  # pragma: no cover - tensorboard is a dependency
                print(f"warning: tensorboard unavailable ({exc}); skipping", file=sys.stderr)
        if "wandb" in backends:
            try:
                import wandb
            except ImportError as exc:
                raise RuntimeError(
                    "trainer.log_backends includes wandb but the wandb package is not installed "
                    "(pip install 'searchr1[wandb]')"
                ) from exc
            os.environ.setdefault("WANDB_MODE", wandb_mode)
            self._wandb = wandb.init(
                project=wandb_project,
                dir=str(self.out_dir),
                config=run_config or {},
                mode=os.environ["WANDB_MODE"],
                resume="allow",
                id=self.out_dir.resolve().name,
            )

    def _truncate_after(self, step: int) -> None:
        """On resume, drop rows logged after the checkpoint (they will be produced again)."""
        if not self.jsonl_path.is_file():
            return
        rows = [r for r in read_metrics(self.jsonl_path) if r.get("step", 0) <= step]
        tmp = self.jsonl_path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.replace(tmp, self.jsonl_path)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": step, "time": time.time(), **{k: _jsonable(v) for k, v in metrics.items()}}
        with self.jsonl_path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        numeric = {
            k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


class ProgressBar:
    """A tqdm bar over steps, with ETA and the key metrics in its postfix (stderr); with ``lines``, one
    plain line per step instead (for logs, and for runs that share a terminal)."""

    def __init__(
        self, total: int, initial: int = 0, enabled: bool = True, lines: bool = False, label: str = "train"
    ) -> None:
        self._bar = None
        self._lines = enabled and lines
        self._total, self._step, self._label = total, initial, label
        self._t0 = time.perf_counter()
        if enabled and not lines:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=label, unit="step", dynamic_ncols=True)

    def update(self, metrics: dict[str, Any]) -> None:
        post = {}
        for key, short in PROGRESS_KEYS:
            value = metrics.get(key)
            if isinstance(value, int | float):
                post[short] = f"{value:.3g}"
        self._step += 1
        if self._lines:
            shown = " ".join(f"{k}={v}" for k, v in post.items())
            elapsed = time.perf_counter() - self._t0
            print(
                f"{self._label}: step {self._step}/{self._total} ({elapsed:.0f} s) {shown}",
                file=sys.stderr,
                flush=True,
            )
        if self._bar is None:
            return
        self._bar.set_postfix(post, refresh=False)
        self._bar.update(1)

    def write(self, text: str) -> None:
        if self._bar is None:
            print(text, file=sys.stderr)
        else:
            self._bar.write(text, file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
