"""Decision groups: the n rollouts of a group all start at one decision point and are compared there.

After a passage the policy must decide: search again when the passage names what to look up next (a bridge
question: "X was founded by Y" -> search Y), answer when it already holds the answer (a single-hop
question). A fresh group reaches that point only in the rows whose first search found the gold passage,
and then compares them with rows that did something else entirely; the branched rollouts of guidance
(``searchr1.trainer.guidance``) put one row at the point, in failed multi-hop groups only. A decision group
(``guidance.decision_groups`` = k groups per step and rank; the branch groups of SLATE, arXiv 2602.23440,
and Tree-GRPO, Ji et al. 2025, arXiv 2509.21240) puts all n rows there: each continues, sampled by the
current policy, from the question's gold prefix p = its first gold search and the real passage the run's
search backend returned for it (``GoldWriter.prefix``, exactly what branched rollouts continue from). The
prefix joins each trajectory as observation tokens (``splice``: written, never trained); every token the
policy wrote after it is trained on-policy. For the rows i = 1..n of decision group g, y_i ~ pi(. | x, p):

    R_i   = the run's reward of the whole trajectory (p, y_i)            (the reward functions see p too)
    A_i   = (R_i - mean_{j in g} R_j) / (std_{j in g} R_j + eps)         (GRPO; no division when
                                                                          algorithm.norm_adv_by_std=false)

and with step rewards on (``searchr1.rewards.steps``, ``searchr1.algorithms.step_credit``) the search
positions are compared within g as in any group. Position 1 is p's search for every row: the same step
reward, so its step advantage is 0, and its tokens are observations, so neither it nor its step reward
reaches the policy. Position 2 is the decision itself, with G the question's gold passages:

    v_i2  = step_gain * new_i2 / |G| - step_redundancy * red_i2 - step_superfluous * [p found all of G]
                                                                   if y_i searches again (its 2nd search)
    v_i2  = 0                                                      if y_i answers (its stop span)
    A_it  = A_i + step_credit_coef * (v_i2 - mean_g v_2) / (std_g v_2 + eps)   on that turn's tokens

On a single-hop question p found the one gold passage, so searching again costs ``step_superfluous``
(more if it repeats p's hits) against 0 for answering; on a two-hop question a second search that finds the
second passage earns step_gain / 2 against 0. ``algorithm.filter_groups`` treats a decision group like
any group: dropped when its rewards and step rewards are all equal (every row decided alike and scored
alike: no advantage anywhere), kept when the rows' outcomes differ or when their step rewards at position
2 differ (some searched again, some answered) even if the outcomes tie.

Which groups: among the groups of this rank's step whose question has a gold path of at least one search
(``searchr1.rollout.gold.gold_path``; ``guidance.min_hops`` does not apply), single-hop (a path of one
search) and multi-hop (two or more) alternately, single-hop first, each kind in batch order; when one kind
runs out the other fills in. At most the rank's groups - 1: some group always rolls out from the prompt
alone. Whatever the group would have scored: the choice is made before the rollout, so the decision groups
are generated in the step's one ``generate`` call *instead of* those groups' fresh rollouts (nothing is
generated and thrown away; the cost is one gold search per decision group and continuations shorter than
fresh rollouts), and replay and guidance (``searchr1.trainer.mixing``) then leave them alone: a decision
group is never replayed into or guided, and its rows are neither stored for replay nor counted in the
rollout metrics, which describe the rollouts from the prompt. Every step, no decay (unlike guidance): the
trained tokens are the policy's own samples; only the state they start from is gold.

Metrics (summed over ranks): ``decision/groups``; ``decision/answer_now_single``, the share of single-hop
decision rows whose first generated turn answers, and ``decision/search_next_multi``, the share of
multi-hop ones whose first generated turn searches; ``decision/reward_single`` and
``decision/reward_multi``, their mean rewards.

    decisions = DecisionGroups(cfg.guidance.decision_groups, [gold_path(s) for s in samples], writer)
    plan = decisions.plan(prompt_ids, metas, groups)      # the step's prompts with the prefixes in place
    trajs = plan.splice(engine.generate(plan.prompt_ids, plan.metas, ...))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from searchr1.rollout.actions import parse_action
from searchr1.rollout.gold import GoldPath, GoldStep, GoldWriter, prefix_meta, splice
from searchr1.rollout.types import Role, Trajectory

DECISION = "decision"
"""``Trajectory.meta["guided"]`` of a decision row."""


def is_decision(traj: Trajectory) -> bool:
    """A row of a decision group (continued from a gold prefix by the current policy)."""
    return (traj.meta or {}).get("guided") == DECISION


def first_action(continuation: Trajectory, decode: Callable[[list[int]], str]) -> str:
    """The action of the first turn the policy generated (``answer``, ``search`` or ``invalid``; ``none``
    when it generated nothing): the first run of generated tokens, parsed as the rollout parses a turn."""
    ids: list[int] = []
    for token, role in zip(continuation.response_ids, continuation.roles, strict=True):
        if role != Role.GENERATED:
            break
        ids.append(int(token))
    return parse_action(decode(ids)).kind if ids else "none"


@dataclass
class DecisionJob:
    """One decision group: its rows, the gold prefix they continue from, and its gold path's searches."""

    group: int
    rows: list[int]
    prefix: GoldStep
    hops: int


@dataclass
class DecisionPlan:
    """What the step's rollout generates: ``prompt_ids`` / ``metas`` with each decision row's prompt
    followed by its gold prefix (``prefix_meta``: the prefix counts against the rollout's budgets);
    ``splice`` turns the engine's output back into trajectories after the original prompts."""

    prompt_ids: list[list[int]]
    metas: list[dict[str, Any]]
    jobs: list[DecisionJob] = field(default_factory=list)
    original_prompts: list[list[int]] = field(default_factory=list)
    tokenizer: Any = None

    def splice(self, trajs: Sequence[Trajectory]) -> list[Trajectory]:
        """The generated batch with each decision row spliced after its original prompt (the gold prefix as
        observation tokens, ``meta``: ``guided="decision"``, ``decision_hops``, ``decision_first``)."""
        out = list(trajs)
        if not self.jobs:
            return out
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
        for job in self.jobs:
            for row in job.rows:
                traj = splice(job.prefix, out[row], self.original_prompts[row], self.tokenizer)
                traj.meta.update(
                    guided=DECISION, decision_hops=job.hops, decision_first=first_action(out[row], decode)
                )
                out[row] = traj
        return out


class DecisionGroups:
    """Chooses a step's decision groups and writes their gold prefixes (see the module docstring)."""

    def __init__(
        self,
        count: int,
        paths: Sequence[GoldPath | None],
        writer: GoldWriter,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.count = count
        self.writer = writer
        self.paths = list(paths)
        if not any(p is not None and p.queries for p in self.paths):
            log("guidance: no training question has a gold path; decision groups are off for this run")

    def path_of(self, meta: Mapping[str, Any]) -> GoldPath | None:
        index = meta.get("sample_index")
        if index is None or not 0 <= int(index) < len(self.paths):
            return None
        path = self.paths[int(index)]
        return path if path is not None and path.queries else None

    def choose(
        self, metas: Sequence[Mapping[str, Any]], groups: Sequence[int]
    ) -> list[tuple[int, list[int], GoldPath]]:
        """``(group, rows, gold path)`` of the decision groups, in batch order: single-hop and multi-hop
        alternately (single-hop first), at most ``count`` and at most the groups - 1."""
        rows_of: dict[int, list[int]] = {}
        for row, gid in enumerate(groups):
            rows_of.setdefault(gid, []).append(row)
        kinds: tuple[list[Any], list[Any]] = ([], [])
        for gid, rows in rows_of.items():
            path = self.path_of(metas[rows[0]])
            if path is not None:
                kinds[len(path.queries) > 1].append((gid, rows, path))
        wanted = min(self.count, len(rows_of) - 1)
        chosen: list[tuple[int, list[int], GoldPath]] = []
        turn = 0
        while len(chosen) < wanted and (kinds[0] or kinds[1]):
            queue = kinds[turn % 2] or kinds[(turn + 1) % 2]
            chosen.append(queue.pop(0))
            turn += 1
        return sorted(chosen, key=lambda c: c[1][0])

    def plan(
        self, prompt_ids: Sequence[Sequence[int]], metas: Sequence[Mapping[str, Any]], groups: Sequence[int]
    ) -> DecisionPlan:
        """The step's generation requests with the decision groups' prefixes in place (one gold search per
        decision group, shared by its n rows)."""
        prompts = [list(p) for p in prompt_ids]
        out_metas = [dict(m) for m in metas]
        jobs = []
        for gid, rows, path in self.choose(metas, groups):
            prefix = self.writer.prefix(path)
            for row in rows:
                prompts[row] = [*prompt_ids[row], *prefix.turn_ids, *prefix.obs_ids]
                out_metas[row] = prefix_meta(metas[row], prefix)
            jobs.append(DecisionJob(gid, rows, prefix, len(path.queries)))
        return DecisionPlan(prompts, out_metas, jobs, [list(p) for p in prompt_ids], self.writer.tokenizer)


def decision_counts(trajs: Sequence[Trajectory], totals: Sequence[float]) -> dict[str, float]:
    """This rank's sums for the decision metrics (``decision_metrics`` divides them once summed over ranks)."""
    out = dict.fromkeys(
        ("decision_groups", "decision_single", "decision_single_answer", "decision_single_reward",
         "decision_multi", "decision_multi_search", "decision_multi_reward"),
        0.0,
    )  # fmt: skip
    seen: set[Any] = set()
    for traj, total in zip(trajs, totals, strict=True):
        if not is_decision(traj):
            continue
        seen.add(traj.meta.get("group_id"))
        first = traj.meta.get("decision_first")
        if int(traj.meta.get("decision_hops", 1)) > 1:
            out["decision_multi"] += 1
            out["decision_multi_search"] += float(first == "search")
            out["decision_multi_reward"] += float(total)
        else:
            out["decision_single"] += 1
            out["decision_single_answer"] += float(first == "answer")
            out["decision_single_reward"] += float(total)
    out["decision_groups"] = float(len(seen))
    return out


def decision_metrics(counts: Mapping[str, float]) -> dict[str, float]:
    """``decision/*`` from the counts summed over ranks (a kind without rows has no share and no mean)."""
    out = {"decision/groups": counts["decision_groups"]}
    if counts["decision_single"]:
        out["decision/answer_now_single"] = counts["decision_single_answer"] / counts["decision_single"]
        out["decision/reward_single"] = counts["decision_single_reward"] / counts["decision_single"]
    if counts["decision_multi"]:
        out["decision/search_next_multi"] = counts["decision_multi_search"] / counts["decision_multi"]
        out["decision/reward_multi"] = counts["decision_multi_reward"] / counts["decision_multi"]
    return out
