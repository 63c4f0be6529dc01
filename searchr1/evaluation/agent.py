"""Ask a trained model questions: ``Agent(model, search_backend).ask(question)``.

    from searchr1 import Agent
    agent = Agent("runs/tiny/checkpoints/step_000050/model", "indexes/world")   # or "http://127.0.0.1:8000"
    result = agent.ask("Where was Alice Verdan born?")
    result.answer, result.queries, result.trajectory.searches

The agent runs the same rollout engine, prompt and trajectory record as training and ``searchr1 eval``
(greedy decoding; the answer is read from the model's own tokens), so what it does here is what it
did there. ``on_event`` receives the answer as it
is produced: the reasoning text while it is generated (through the engine's token listener), each
search with its hits when the search returns, and the answer at the end.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchr1.config import SearchR1Config
from searchr1.data.prompts import INFO_OPEN, resolve_template
from searchr1.evaluation.modes import mode_prompt
from searchr1.retrieval.base import Retriever
from searchr1.rollout.records import trajectory_record
from searchr1.rollout.registry import build_engine, generation_dtype
from searchr1.rollout.types import Trajectory

if TYPE_CHECKING:
    from searchr1.rollout.engine import NewToken


@dataclass
class AgentEvent:
    """One piece of an answer, in trajectory order."""

    kind: str
    """text (the model's own tokens) | search (a query and its hits) | note (a masked non-search
    observation such as the invalid-action message) | answer."""
    text: str = ""
    hits: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class AgentAnswer:
    question: str
    answer: str | None
    trajectory: Trajectory
    record: dict[str, Any]
    """The record ``searchr1 eval`` writes for a trajectory (segments by role, queries, documents)."""

    @property
    def queries(self) -> list[str]:
        return list(self.trajectory.queries)

    @property
    def documents(self) -> list[list[dict[str, Any]]]:
        return self.record["documents"]

    def events(self) -> list[AgentEvent]:
        """The trajectory as display events: model text, searches with their hits, then the answer."""
        out: list[AgentEvent] = []
        search = 0
        for seg in self.record["segments"][1:]:
            if seg["role"] == "generated":
                out.append(AgentEvent("text", seg["text"]))
            elif INFO_OPEN in seg["text"] and search < len(self.record["queries"]):
                hits = self.record["documents"][search] if search < len(self.record["documents"]) else []
                out.append(AgentEvent("search", self.record["queries"][search], hits))
                search += 1
            else:
                out.append(AgentEvent("note", seg["text"]))
        out.append(AgentEvent("answer", self.answer or ""))
        return out

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        return {
            "question": self.question,
            "answer": self.answer,
            "searches": r["searches"],
            "turns": r["turns"],
            "queries": r["queries"],
            "hits": [
                [{"title": h.get("title"), "id": h.get("id"), "score": h.get("score")} for h in hs]
                for hs in r["documents"]
            ],
            "valid_format": bool(r["scores"]["valid_format"]),
            "truncated": r["truncated"],
            "finish_reason": r["finish_reason"],
            "segments": r["segments"],
        }


class StreamingObserver:
    """The engine's token listener for ``ask`` (``generate(on_tokens=)``): it decodes the first row's
    current turn as its tokens arrive and passes the new text on (to ``emit``, when set)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.emit: Callable[[AgentEvent], None] | None = None
        self._turn: int | None = None
        self._ids: list[int] = []
        self._shown = ""

    def reset(self) -> None:
        self._turn, self._ids, self._shown = None, [], ""

    def __call__(self, tokens: Sequence[NewToken]) -> None:
        if self.emit is None:
            return
        for new in tokens:
            if new.row != 0:  # ask() generates one row
                continue
            if new.turn != self._turn:
                self._turn, self._ids, self._shown = new.turn, [], ""
            self._ids.append(new.token)
            text = self.tokenizer.decode(self._ids, skip_special_tokens=False)
            if text.startswith(self._shown) and not text.endswith("\ufffd") and len(text) > len(self._shown):
                self.emit(AgentEvent("text", text[len(self._shown) :]))
                self._shown = text


class ObservedRetriever:
    """Wraps a retriever and reports every search (query and hits) as it returns."""

    def __init__(self, retriever: Any):
        self.retriever = retriever
        self.emit: Callable[[AgentEvent], None] | None = None

    def search(self, queries: list[str], topk: int) -> list[list[Any]]:
        results = self.retriever.search(queries, topk)
        if self.emit is not None:
            for query, hits in zip(queries, results, strict=True):
                self.emit(
                    AgentEvent(
                        "search", query, [h.to_dict() if hasattr(h, "to_dict") else dict(h) for h in hits]
                    )
                )
        return results

    def close(self) -> None:
        if hasattr(self.retriever, "close"):
            self.retriever.close()


def open_search_backend(backend: Any, topk: int = 3) -> Any:
    """A ``Retriever`` from a retriever object, a server URL, an index folder or a corpus jsonl."""

    if backend is None or isinstance(backend, Retriever) or hasattr(backend, "search"):
        return backend
    text = str(backend)
    if text.startswith(("http://", "https://")):
        from searchr1.retrieval.client import RetrievalClient

        return RetrievalClient(text)
    path = Path(text)
    if path.is_dir():
        from searchr1.retrieval.index import load_index

        return load_index(path)
    if path.is_file():
        from searchr1.retrieval.bm25 import BM25Retriever

        return BM25Retriever.from_corpus(path)
    raise FileNotFoundError(
        f"search backend not found: {text} (expected an index folder, a corpus jsonl or a URL)"
    )


class Agent:
    """A model that reasons and searches, answering one question (or many) at a time.

    ``model``: a hub id or local folder, or a loaded model (then pass ``tokenizer``).
    ``search_backend``: a ``Retriever``, an index folder, a corpus jsonl (BM25 in memory) or a
    retrieval-server URL. ``config``: a ``SearchR1Config`` whose ``rollout``, ``retrieval.topk`` and
    ``data.template`` apply (default: the defaults); ``template``, ``topk``, ``max_turns``,
    ``max_turn_tokens``, ``engine`` and ``dtype`` (the generation dtype, ``rollout.dtype``: auto, float32,
    bfloat16, float16; a model given by name is loaded in it) override it. ``engine_kwargs`` go to the
    rollout engine's factory.
    """

    def __init__(
        self,
        model: Any,
        search_backend: Any,
        *,
        tokenizer: Any = None,
        template: str | None = None,
        topk: int | None = None,
        max_turns: int | None = None,
        max_turn_tokens: int | None = None,
        dtype: str | None = None,
        device: str | None = None,
        engine: str | None = None,
        config: SearchR1Config | None = None,
        **engine_kwargs: Any,
    ):
        from searchr1.models import load_model, load_tokenizer

        cfg = copy.deepcopy(config) if config is not None else SearchR1Config()
        for section, key, value in (
            (cfg.rollout, "engine", engine),
            (cfg.rollout, "dtype", dtype),
            (cfg.rollout, "max_turns", max_turns),
            (cfg.rollout, "max_turn_tokens", max_turn_tokens),
            (cfg.retrieval, "topk", topk),
            (cfg.data, "template", template),
        ):
            if value is not None:
                setattr(section, key, value)
        if isinstance(model, str | Path):
            import torch

            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            cfg.rollout.dtype = generation_dtype(cfg, torch.device(device).type)  # loaded in it: no copy
            tokenizer = tokenizer or load_tokenizer(model)
            model = load_model(model, dtype=cfg.rollout.dtype, device=device)
        elif tokenizer is None:
            raise ValueError("Agent: pass tokenizer= together with a loaded model")
        model.eval()
        self.config = cfg
        cfg.data.template = resolve_template(cfg.data.template, tokenizer)
        self.model, self.tokenizer, self.template = model, tokenizer, cfg.data.template
        self.retriever = open_search_backend(search_backend, cfg.retrieval.topk)
        self._observer = StreamingObserver(tokenizer)
        self._searches = ObservedRetriever(self.retriever)
        self.engine = build_engine(cfg, model, tokenizer, self._searches, **engine_kwargs)

    def ask_many(self, questions: list[str]) -> list[AgentAnswer]:
        """Answer several questions in one batch (greedy)."""
        from searchr1.rollout.sampling import SamplingParams

        views = [
            {"index": i, "id": str(i), "question": q, "golden_answers": [], "data_source": "ask"}
            for i, q in enumerate(questions)
        ]
        prompts = [mode_prompt("agent", v, template=self.template, tokenizer=self.tokenizer) for v in views]
        ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        trajs = self.engine.generate(
            ids,
            [dict(v) for v in views],
            sampling=SamplingParams.greedy_eval(),
            seed=0,
            on_tokens=self._observer,
        )
        out = []
        for q, v, t in zip(questions, views, trajs, strict=True):
            rec = trajectory_record(t, v, self.tokenizer, "agent")
            out.append(AgentAnswer(question=q, answer=rec["answer"], trajectory=t, record=rec))
        return out

    def ask(self, question: str, on_event: Callable[[AgentEvent], None] | None = None) -> AgentAnswer:
        """Answer ``question``; ``on_event`` gets the reasoning as it is generated, each search with
        its hits as it returns, then the answer (``AgentAnswer.events()`` replays the same afterwards)."""
        self._observer.emit = self._searches.emit = on_event
        self._observer.reset()
        try:
            result = self.ask_many([question])[0]
        finally:
            self._observer.emit = self._searches.emit = None
        if on_event is not None:
            on_event(AgentEvent("answer", result.answer or ""))
        return result

    def close(self) -> None:
        self.engine.close()
        if self.retriever is not None and hasattr(self.retriever, "close"):
            self.retriever.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
