"""The warm start: supervised LoRA on gold trajectories before RL.

A 135M policy rarely samples the two-search path of a two-hop question, so on-policy RL has little to
reinforce; a short supervised stage on the training questions' gold paths (DGPO, arXiv 2508.20324: a warm
start on gold trajectories before RL lifts a 0.5B policy from 0.238 to 0.298 average EM before RL adds its
share) shows it both sides of the decision: single-hop questions search, read and answer; two-hop
questions search, read, search the name the passage gives, read and answer. Each trajectory is written by
``searchr1.rollout.gold.GoldWriter`` in the run's own format with real observations of the run's search
backend (the same writer as guidance), from the training split only.

Loss: the weighted mean negative log-likelihood of the generated tokens (observation and prompt tokens
are context only, never targets) over the tokens of an optimizer step::

    L(theta) = - sum_{(i, t) in G} w_{i,t} log pi_theta(y_{i,t} | y_{i,<t}) / sum_{(i, t) in G} w_{i,t}

with ``G`` the generated tokens, ``w = warmstart.decision_weight`` on the tokens where a trajectory decides
after its first passage (``meta["decision_span"]``, ``searchr1.rollout.gold``) and 1 elsewhere: the
decision is one token in about 300, the rest mostly copied, so a weight above 1 lets it be learnt in fewer
steps (1 is the plain mean).

The adapter is trained with AdamW (linear warm-up, then constant), ``warmstart.batch_size`` trajectories a
step, in a seeded order (a fresh permutation per pass). Checkpoints (the adapter, the optimizer, the step,
the random state) make a killed warm start resume bit-identically; the result is ``<out>/model``, a Hugging
Face folder with the adapter merged, from which RL starts (``model.path``) with a fresh adapter.

    result = run_warm_start(cfg)                 # cfg.warmstart.epochs > 0; idempotent
    cfg.model.path = str(result.model_dir)       # what `searchr1 train` does before RL

With ``warmstart.holdout`` > 0 a slice of the training questions is held out (never trained) and the
decision after the first gold passage is checked on it, teacher-forced, every ``warmstart.check_every``
steps (``searchr1.trainer.warmstart_check``); the adapter of the best check is the one saved, and the stage
stops once the check reaches ``warmstart.stop_at``. The folder also gets the run's ``config.yaml``, so that
``eval`` and ``ask`` give ``<out>/model`` the settings it was trained with.

A row without a gold path (``GOLD_PATH_KEYS``) is skipped and counted, the first ones named by number; data
where no row has one is refused (``WarmStartError``) before any model loads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from searchr1.data.formats import load_samples, sample_kind, sample_meta, sample_prompt
from searchr1.data.prompts import resolve_template
from searchr1.models import load_model, load_tokenizer
from searchr1.precision import autocast
from searchr1.rollout.gold import GOLD_PATH_KEYS, GoldWriter, gold_path
from searchr1.rollout.types import Trajectory
from searchr1.trainer import components
from searchr1.trainer.distributed import resolve_device
from searchr1.trainer.experience import build_experience, micro_batches
from searchr1.trainer.frozen_trunk import FrozenTrunk
from searchr1.trainer.policy import PolicyLogprobs
from searchr1.trainer.tracking import ProgressBar
from searchr1.trainer.warmstart_check import DecisionCheck, holdout_split

STATE_FILE = "state.pt"
SUMMARY_FILE = "warmstart.json"
MODEL_DIR = "model"


class WarmStartError(ValueError):
    """The warm start cannot run on this data or in this folder (the message says why, in one line)."""


@dataclass
class GoldExamples:
    """The gold trajectories of the training questions, and the rows that gave none."""

    trajectories: list[Trajectory]
    kinds: list[str]
    skipped: list[int] = field(default_factory=list)
    """Row numbers (1-based, in the training data) without a gold path."""
    cut: int = 0
    """Trajectories cut at a turn boundary to fit ``rollout.max_turns`` / ``max_response_tokens``."""


@dataclass
class WarmStartResult:
    model_dir: Path
    summary: dict[str, Any]


def warm_start_dir(cfg: Any) -> Path:
    """``warmstart.out_dir``, else ``<trainer.out_dir>/warmstart``."""
    return Path(cfg.warmstart.out_dir) if cfg.warmstart.out_dir else Path(cfg.trainer.out_dir) / "warmstart"


def gold_examples(
    samples: Sequence[Any], tokenizer: Any, template: str, writer: GoldWriter, max_examples: int = 0
) -> GoldExamples:
    """One gold trajectory per sample that has a gold path (the first ``max_examples``; 0 = all)."""
    out = GoldExamples([], [])
    for index, sample in enumerate(samples):
        if max_examples and len(out.trajectories) >= max_examples:
            break
        path = gold_path(sample)
        if path is None:
            out.skipped.append(index + 1)
            continue
        prompt = tokenizer(sample_prompt(sample, template, tokenizer), add_special_tokens=False)["input_ids"]
        gold = writer.trajectory(prompt, path, sample_meta(sample, index))
        out.trajectories.append(gold.trajectory)
        out.kinds.append(sample_kind(sample))
        out.cut += int(gold.cut)
    if not out.trajectories:
        raise WarmStartError(
            f"warm start: none of the {len(samples)} training rows has a gold path; it needs {GOLD_PATH_KEYS}"
        )
    return out


def step_order(n: int, epochs: float, batch_size: int, seed: int) -> list[list[int]]:
    """The examples of each optimizer step: passes over a fresh seeded permutation of ``range(n)`` each,
    ``ceil(epochs * n / batch_size)`` steps of ``batch_size`` (the last one may be shorter)."""
    total = math.ceil(epochs * n)
    order: list[int] = []
    epoch = 0
    while len(order) < total:
        gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + epoch)
        order.extend(torch.randperm(n, generator=gen).tolist())
        epoch += 1
    order = order[:total]
    return [order[i : i + batch_size] for i in range(0, total, batch_size)]


def sft_loss(
    actor: Any,
    exp: Any,
    rows: list[int],
    total_tokens: float,
    device: torch.device,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """``L`` of the module docstring for ``rows`` of the padded batch ``exp``, normalised by the step's
    (weighted) generated-token count ``total_tokens`` (so micro-batches add up to the step's mean);
    ``weights``: ``w`` over the whole batch (None: 1 on every generated token)."""
    mb = exp.select(rows).to(device)
    logprobs, _ = actor(mb.input_ids, mb.attention_mask, target_mask=mb.train_mask)
    mask = mb.train_mask.to(torch.float32)
    if weights is not None:
        mask = mask * weights[rows, : mask.shape[1]].to(device)  # the sub-batch is trimmed to its own length
    return -(logprobs.float() * mask).sum() / total_tokens


def token_weights(trajectories: Sequence[Trajectory], exp: Any, decision_weight: float) -> torch.Tensor | None:
    """``w`` of the module docstring over the padded batch ``exp`` of ``trajectories`` (right-padded, the
    response after the prompt); None when every weight is 1."""
    if decision_weight == 1.0:
        return None
    weights = exp.train_mask.to(torch.float32).clone()
    for i, traj in enumerate(trajectories):
        span = traj.meta.get("decision_span")
        if span:
            start = len(traj.prompt_ids)
            weights[i, start + span[0] : start + span[1]] *= decision_weight
    return weights


def _fingerprint(cfg: Any, n: int) -> str:
    """What a checkpoint must agree with to be resumed."""
    w, m = cfg.warmstart, cfg.model
    keys = [m.path, m.lora_r, m.lora_alpha, sorted(m.lora_targets), w.epochs, w.lr, w.warmup_steps,
            w.batch_size, w.max_examples, cfg.seed, cfg.data.template, n]  # fmt: skip
    if w.holdout or w.decision_weight != 1.0:  # an older warm start keeps its fingerprint
        keys += [w.holdout, w.check_every, w.stop_at, w.decision_weight]
    return hashlib.sha256(json.dumps(keys, default=str).encode()).hexdigest()[:16]


def _save_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


class WarmStart:
    """The supervised stage on gold trajectories (``run_warm_start`` builds it from a config)."""

    def __init__(
        self,
        cfg: Any,
        policy: Any,
        tokenizer: Any,
        examples: GoldExamples,
        out_dir: Path,
        device: torch.device | None = None,
        log: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
        check: DecisionCheck | None = None,
    ) -> None:
        self.cfg = cfg
        self.check = check
        """The held-out decision check (None: none); ``checks`` holds its results by step."""
        self.checks: list[dict[str, Any]] = []
        self.best: dict[str, Any] | None = None
        """The best check so far: ``{"step", "decision_accuracy", "adapter"}`` (the adapter's tensors)."""
        self.wcfg = cfg.warmstart
        self.policy = policy
        self.tokenizer = tokenizer
        self.examples = examples
        self.out_dir = Path(out_dir)
        self.device = device or torch.device("cpu")
        self.log = log
        self.actor = PolicyLogprobs(
            policy, share_prefix=cfg.trainer.share_prompt_prefix, fused=cfg.trainer.fused_update
        )
        self.params = [p for p in policy.parameters() if p.requires_grad]
        if not self.params:
            raise WarmStartError("warm start: the policy has no trainable parameter (LoRA expected)")
        self.optimizer = torch.optim.AdamW(self.params, lr=self.wcfg.lr, weight_decay=0.0)
        self.steps = step_order(len(examples.trajectories), self.wcfg.epochs, self.wcfg.batch_size, cfg.seed)
        self.fingerprint = _fingerprint(cfg, len(examples.trajectories))
        self.step = 0
        self.losses: list[float] = []

    def lr_at(self, step: int) -> float:
        warm = self.wcfg.warmup_steps
        return self.wcfg.lr * min(1.0, (step + 1) / warm) if warm else self.wcfg.lr

    def state_dict(self) -> dict[str, Any]:
        names = [n for n, p in self.policy.named_parameters() if p.requires_grad]
        return {
            "fingerprint": self.fingerprint,
            "step": self.step,
            "losses": list(self.losses),
            "adapter": {n: p.detach().clone() for n, p in zip(names, self.params, strict=True)},
            "optimizer": self.optimizer.state_dict(),
            "rng": torch.get_rng_state(),
            "checks": list(self.checks),
            "best": self.best,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("fingerprint") != self.fingerprint:
            raise WarmStartError(
                f"warm start: {self.out_dir / STATE_FILE} was written with other settings or data; remove "
                f"{self.out_dir} or set warmstart.out_dir to start afresh"
            )
        named = dict(self.policy.named_parameters())
        with torch.no_grad():
            for name, value in state["adapter"].items():
                named[name].copy_(value)
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.losses = [float(x) for x in state["losses"]]
        self.checks = list(state.get("checks", []))
        self.best = state.get("best")

    def train_step(self, rows: list[int]) -> float:
        """One optimizer step on the examples ``rows``; returns the step's loss."""
        trajs = [self.examples.trajectories[i] for i in rows]
        pad = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0)
        exp = build_experience(trajs, [0.0] * len(trajs), list(range(len(trajs))), pad)
        weights = token_weights(trajs, exp, self.wcfg.decision_weight)
        total = float(exp.train_mask.sum() if weights is None else weights.sum())
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(self.step)
        self.optimizer.zero_grad(set_to_none=True)
        self.policy.train()
        loss_sum = 0.0
        with autocast(self.device, self.cfg.model.bf16_autocast):
            started = self.actor.begin_step(
                exp.input_ids.to(self.device),
                exp.attention_mask.to(self.device),
                exp.train_mask.to(self.device),
            )
        try:
            for mb in micro_batches(list(range(len(trajs))), exp.seq_lens, self.wcfg.micro_batch_size):
                with autocast(self.device, self.cfg.model.bf16_autocast):
                    loss = sft_loss(self.actor, exp, mb, total, self.device, weights)
                loss.backward()
                loss_sum += float(loss.detach())
            if started is not None:
                self.actor.end_step()
        finally:
            self.actor.end_step(backward=False)
        torch.nn.utils.clip_grad_norm_(self.params, self.cfg.trainer.grad_clip or math.inf)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.losses.append(loss_sum)
        return loss_sum

    @property
    def stopped(self) -> bool:
        """The held-out check reached ``warmstart.stop_at``: the stage is done before its last step."""
        return bool(self.checks) and (self.checks[-1].get("decision_accuracy") or 0.0) >= self.wcfg.stop_at

    @property
    def done(self) -> bool:
        return self.step >= len(self.steps) or self.stopped

    def run_check(self) -> dict[str, Any]:
        """Check the policy on the held-out slice now; the adapter is kept when it is the best so far (a
        strictly higher decision accuracy: a tie keeps the earlier step)."""
        assert self.check is not None
        t0 = time.perf_counter()
        decoder = self.actor.fused_decoder()
        result = {"step": self.step, **self.check.measure(self.policy, self.device, decoder=decoder)}
        result["seconds"] = time.perf_counter() - t0
        self.checks.append(result)
        accuracy = result["decision_accuracy"]
        if accuracy is not None and (self.best is None or accuracy > self.best["decision_accuracy"]):
            names = [n for n, p in self.policy.named_parameters() if p.requires_grad]
            adapter = {n: p.detach().clone() for n, p in zip(names, self.params, strict=True)}
            self.best = {"step": self.step, "decision_accuracy": accuracy, "adapter": adapter}
        return result

    def restore_best(self) -> int | None:
        """Put the adapter of the best check back into the policy; returns its step (None: no check)."""
        if self.best is None:
            return None
        named = dict(self.policy.named_parameters())
        with torch.no_grad():
            for name, value in self.best["adapter"].items():
                named[name].copy_(value)
        return int(self.best["step"])

    def run(self, progress: bool = True, stop_after: int | None = None) -> None:
        """Train from the current step to the end (``stop_after``: that many steps at most, for tests of
        an interrupted stage), checkpointing every ``warmstart.save_every`` steps and at the end; with a
        held-out check, checking every ``warmstart.check_every`` steps and at the end, and stopping once the
        check reaches ``warmstart.stop_at``. With ``warmstart.lora_layers`` the layers below the adapter run
        once per trajectory (``searchr1.trainer.frozen_trunk``)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with self.frozen_trunk() as trunk:
            self._run(progress, stop_after)
        if trunk is not None:
            gib = trunk.bytes / 2**30
            self.log(
                f"warm start: the {trunk.layers} layers below the adapter ran once per trajectory "
                f"({len(trunk)} cached, {gib:.2f} GiB; {trunk.hits} rows read, {trunk.misses} computed)"
            )

    @contextlib.contextmanager
    def frozen_trunk(self) -> Iterator[FrozenTrunk | None]:
        """With ``warmstart.lora_layers`` (and the fused decoder), a ``FrozenTrunk`` of the layers below the
        adapter attached to the decoder for the block, detached after it; else None."""
        decoder = self.actor.fused_decoder() if self.wcfg.lora_layers else None
        frozen = len(decoder.layers) - self.wcfg.lora_layers if decoder is not None else 0
        if decoder is None or frozen < 1:
            yield None
            return
        decoder.trunk = trunk = FrozenTrunk(frozen)
        try:
            yield trunk
        finally:
            decoder.trunk = None

    def _run(self, progress: bool, stop_after: int | None) -> None:
        bar = ProgressBar(len(self.steps), initial=self.step, enabled=progress, label="warm start")
        if self.check is not None and not self.checks:  # the starting policy, as step 0
            self._log_check(self.run_check())
        done = 0
        while not self.done:
            if stop_after is not None and done >= stop_after:
                return
            loss = self.train_step(self.steps[self.step])
            done += 1
            bar.update({"warmstart/loss": loss})
            last = self.step == len(self.steps)
            if self.check is not None and (self.step % self.wcfg.check_every == 0 or last):
                self._log_check(self.run_check())
            every = self.wcfg.save_every
            if (every and self.step % every == 0) or self.done:
                _save_state(self.out_dir / STATE_FILE, self.state_dict())

    def _log_check(self, check: dict[str, Any]) -> None:
        s, a = check["search_side"], check["answer_side"]
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        self.log(
            f"warm start: step {check['step']}: held-out decision accuracy {fmt(check['decision_accuracy'])} "
            f"(search side {fmt(s['p'])} over {s['questions']}, answer side {fmt(a['p'])} over {a['questions']})"
        )

    def resume(self) -> bool:
        """Load the folder's checkpoint if there is one; True if it was loaded."""
        path = self.out_dir / STATE_FILE
        if not path.is_file():
            return False
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:  # a truncated or foreign file: one line, nothing lost
            raise WarmStartError(
                f"warm start: {path} cannot be read ({type(exc).__name__}); remove it to start afresh"
            ) from None
        self.load_state_dict(state)
        self.log(f"warm start: resumed at step {self.step}/{len(self.steps)}")
        return True


def summary_of(stage: WarmStart, seconds: float) -> dict[str, Any]:
    ex = stage.examples
    best = stage.best
    return {
        "done": stage.done,
        "fingerprint": stage.fingerprint,
        "steps": stage.step,
        "planned_steps": len(stage.steps),
        "stopped_early": stage.stopped and stage.step < len(stage.steps),
        "checks": stage.checks,
        "kept_step": None if best is None else best["step"],
        "kept_decision_accuracy": None if best is None else best["decision_accuracy"],
        "holdout": len(stage.check.items) if stage.check is not None else 0,
        "examples": len(ex.trajectories),
        "examples_by_kind": {k: ex.kinds.count(k) for k in sorted(set(ex.kinds))},
        "skipped_rows": len(ex.skipped),
        "cut": ex.cut,
        "loss_first": stage.losses[0] if stage.losses else None,
        "loss_last": stage.losses[-1] if stage.losses else None,
        "losses": stage.losses,
        "seconds": seconds,
    }


def run_warm_start(
    cfg: Any,
    *,
    model: Any = None,
    tokenizer: Any = None,
    retriever: Any = None,
    train_samples: Sequence[Any] | None = None,
    progress: bool = True,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> WarmStartResult:
    """The warm start of ``cfg`` (``warmstart.*``), resumed where a checkpoint is found; a finished one is
    returned as it is. Pieces may be injected as in ``RLTrainer``; the rest is built from ``cfg``."""
    out = warm_start_dir(cfg)
    summary_path = out / SUMMARY_FILE
    if summary_path.is_file() and (out / MODEL_DIR).is_dir():
        summary = json.loads(summary_path.read_text())
        if summary.get("done"):
            log(f"warm start: done before ({out / MODEL_DIR})")
            return WarmStartResult(out / MODEL_DIR, summary)
    t0 = time.perf_counter()
    if train_samples is None:
        components.prepare_files(cfg, world=True, model=model is None)
        files, _, corpus = components.resolve_data(cfg, Path(cfg.trainer.out_dir))
        train_samples = [s for path in files for s in load_samples(path)]
    else:
        corpus = None
        if model is None:
            components.prepare_files(cfg, world=False, model=True)
    if tokenizer is None:
        tokenizer = load_tokenizer(cfg.model.tokenizer or cfg.model.path)
    if retriever is None:
        retriever = components._retriever(cfg, corpus)
    template = resolve_template(cfg.data.template, tokenizer)
    writer = GoldWriter(tokenizer, cfg.rollout, retriever, cfg.retrieval.topk)
    check = None
    if cfg.warmstart.holdout:
        held, trained = holdout_split(train_samples, cfg.warmstart.holdout, cfg.seed)
        check = DecisionCheck.build([train_samples[i] for i in held], tokenizer, template, writer)
        train_samples = [train_samples[i] for i in trained]
        log(f"warm start: {len(held)} training questions held out to check the decision ({check.sides})")
    examples = gold_examples(train_samples, tokenizer, template, writer, cfg.warmstart.max_examples)
    if examples.skipped:
        shown = ", ".join(map(str, examples.skipped[:5])) + (" ..." if len(examples.skipped) > 5 else "")
        log(f"warm start: {len(examples.skipped)} training rows without a gold path skipped (rows {shown})")
    log(
        f"warm start: {len(examples.trajectories)} gold trajectories "
        f"({', '.join(f'{k} {examples.kinds.count(k)}' for k in sorted(set(examples.kinds)))}), "
        f"{examples.cut} cut to the budget"
    )
    torch.manual_seed(cfg.seed)
    if model is None:
        model = load_model(cfg.model.path, dtype=cfg.model.dtype)
    policy = components._apply_lora(model, cfg.model, resume_from=None, top_layers=cfg.warmstart.lora_layers)
    device = resolve_device(cfg.trainer.device)
    policy.to(device)
    stage = WarmStart(cfg, policy, tokenizer, examples, out, device=device, log=log, check=check)
    stage.resume()
    out.mkdir(parents=True, exist_ok=True)  # eval and ask read the policy's settings from it (<model>/../)
    (out / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
    stage.run(progress=progress)
    kept = stage.restore_best()
    if kept is not None:
        log(f"warm start: the adapter of step {kept} is kept (held-out decision accuracy "
            f"{stage.best['decision_accuracy']:.3f})")  # fmt: skip
    components.save_policy(policy, tokenizer, out / "checkpoint", lora=True)
    final = out / MODEL_DIR
    if final.exists():
        import shutil

        shutil.rmtree(final)
    os.replace(out / "checkpoint" / "model", final)
    summary = summary_of(stage, time.perf_counter() - t0)
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    log(
        f"warm start: {stage.step} steps, loss {summary['loss_first']:.3f} -> {summary['loss_last']:.3f} "
        f"({summary['seconds']:.0f} s): {final}"
    )
    return WarmStartResult(final, summary)


__all__ = [
    "GoldExamples",
    "WarmStart",
    "WarmStartError",
    "WarmStartResult",
    "gold_examples",
    "run_warm_start",
    "sft_loss",
    "step_order",
    "token_weights",
    "warm_start_dir",
]
