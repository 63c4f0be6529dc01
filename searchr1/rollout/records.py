"""One JSON record per trajectory: what ``searchr1 eval``, validation and the trainer's samples write.

    record = trajectory_record(traj, sample, tokenizer, mode="agent")
    record["answer"], record["scores"]["em"], record["segments"]        # runs of prompt / generated / observation

The answer is read from the model's own tokens only (``Trajectory.generated_spans``: the role mask
the rollout keeps), so text the environment inserted (information blocks, the invalid-action
message) is never taken for an answer. The whole trajectory is kept as role-tagged segments, so the
report can show what was generated and trained and what was retrieved and masked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from searchr1.rewards.format import is_valid_format
from searchr1.rewards.text import answer_scores, read_answer
from searchr1.rollout.types import Role, Trajectory

ROLE_NAMES = {Role.PROMPT: "prompt", Role.GENERATED: "generated", Role.OBSERVATION: "observation"}


def role_segments(traj: Trajectory, decode: Callable[[list[int]], str]) -> list[dict[str, Any]]:
    """The whole trajectory as runs of same-role tokens: ``[{"role", "text", "tokens"}, ...]``."""
    segments = [{"role": "prompt", "text": decode(traj.prompt_ids), "tokens": len(traj.prompt_ids)}]
    run: list[int] = []
    run_role: int | None = None
    for tid, role in zip(traj.response_ids, traj.roles, strict=True):
        if role != run_role and run:
            segments.append({"role": ROLE_NAMES[Role(run_role)], "text": decode(run), "tokens": len(run)})
            run = []
        run_role = role
        run.append(tid)
    if run:
        segments.append({"role": ROLE_NAMES[Role(run_role)], "text": decode(run), "tokens": len(run)})
    return segments


def jsonable_hit(hit: Any) -> dict[str, Any]:
    """A retrieved hit as a JSON object (``Hit.to_dict()``, a dict as it is, else its attributes)."""
    if isinstance(hit, Mapping):
        return dict(hit)
    if hasattr(hit, "to_dict"):
        return hit.to_dict()
    return {
        "id": getattr(hit, "id", ""),
        "title": getattr(hit, "title", ""),
        "text": getattr(hit, "text", ""),
        "score": getattr(hit, "score", 0.0),
    }


def answer_and_scores(
    traj: Trajectory,
    decode_text: Callable[[list[int]], str],
    golden_answers: list[str],
    normalization: str = "squad",
    reply_fallback: bool = False,
) -> tuple[str | None, str, dict[str, float]]:
    """``(answer, source, {"em", "sub_em", "f1"})``: the one way a trajectory's answer is read and
    scored, by the evaluation, validation and the trainer's progress line alike (the reward reads the
    same generated spans): the last closed ``<answer>`` inside one run of generated tokens."""
    answer, source = read_answer(traj.generated_spans(decode_text), fallback_to_reply=reply_fallback)
    return answer, source, answer_scores(answer, golden_answers, normalization)


def trajectory_record(
    traj: Trajectory,
    sample: Mapping[str, Any],
    tokenizer: Any,
    mode: str,
    *,
    reply_fallback: bool = False,
    normalization: str = "squad",
) -> dict[str, Any]:
    """The JSON line written for one trajectory (``sample``'s fields first, then what happened and
    its scores).

    ``reply_fallback``: without an answer tag, score the model's reply itself (the direct / cot / rag
    baselines); otherwise such a trajectory has no answer (``answer`` None, every score 0).
    ``scores``: em, sub_em, f1 (``normalization``), valid_format (the Search-R1 structure check of
    the whole response) and tagged (the answer came from an ``<answer>`` tag).
    """

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    def decode_text(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    answer, source, scores = answer_and_scores(
        traj, decode_text, list(sample.get("golden_answers") or []), normalization, reply_fallback
    )
    scores["valid_format"] = float(is_valid_format(decode(traj.response_ids)))
    scores["tagged"] = float(source == "tag")
    return {
        **sample,
        "mode": mode,
        "answer": answer,
        "answer_source": source,
        "scores": scores,
        "correct": scores["em"] == 1.0,
        "searches": traj.searches,
        "turns": traj.turns,
        "truncated": bool(traj.truncated),
        "finish_reason": traj.finish_reason,
        "invalid_actions": traj.invalid_actions,
        "search_failures": traj.search_failures,
        "search_errors": [str(e) for e in (traj.meta or {}).get("search_errors", [])],
        "queries": list(traj.queries),
        "documents": [[jsonable_hit(h) for h in hits] for hits in traj.documents],
        "num_tokens": {
            "prompt": len(traj.prompt_ids),
            "response": len(traj.response_ids),
            "generated": traj.num_generated,
        },
        "segments": role_segments(traj, decode),
    }
