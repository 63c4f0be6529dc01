"""The Python API: ``SearchR1Trainer``, over the same typed configuration as ``searchr1 train``.

    from searchr1 import SearchR1Trainer
    from searchr1.retrieval import BM25Retriever

    trainer = SearchR1Trainer(
        model_name="Qwen/Qwen2.5-3B",                  # hub id or local folder ("tiny" on a laptop)
        search_backend="http://127.0.0.1:8000",        # or "bm25" / "dense" + search_index=..., or a Retriever
        rl_algorithm="grpo",                           # ppo | grpo | rloo | reinforce | reinforce_plus_plus
        reward_config={"correct_answer": 10.0, "search_penalty": -0.1, "invalid_format": -5.0},
        max_search_turns=4,
    )
    summary = trainer.train(train_data="train.parquet", num_iterations=200, batch_size=64)

Every other setting is reachable with dotted keys: ``SearchR1Trainer(..., overrides={"trainer.actor_lr":
1e-6, "rollout.n": 5})`` or a YAML file with ``config="grpo_qwen2.5_3b"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from searchr1.algorithms.presets import preset_overrides
from searchr1.config import load_config, resolve_config_path
from searchr1.rewards.config import RewardConfig


def _override(key: str, value: Any) -> str:
    text = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip()
    if text.endswith("\n..."):
        text = text[: -len("\n...")]
    return f"{key}={text}"


class SearchR1Trainer:
    """Train a model to reason and search with RL. Settings not given keep the config's defaults."""

    def __init__(
        self,
        model_name: str | None = None,
        search_backend: Any = None,
        rl_algorithm: str | None = None,
        reward_config: Mapping[str, float] | None = None,
        max_search_turns: int | None = None,
        *,
        config: str | Path | None = None,
        search_index: str | None = None,
        corpus: str | None = None,
        topk: int | None = None,
        group_size: int | None = None,
        learning_rate: float | None = None,
        output_dir: str | Path | None = None,
        lora_r: int | None = None,
        seed: int | None = None,
        overrides: Mapping[str, Any] | Sequence[str] | None = None,
    ) -> None:
        if rl_algorithm is None and config is None:
            rl_algorithm = "grpo"
        # a YAML config decides everything that is not asked for explicitly here
        items: dict[str, Any] = preset_overrides(rl_algorithm) if rl_algorithm is not None else {}
        self.config_path = resolve_config_path(config)
        self.retriever = None
        if model_name is not None:
            items["model.path"] = model_name
        if isinstance(search_backend, str):
            if search_backend.startswith(("http://", "https://")):
                items["retrieval.backend"] = "http"
                items["retrieval.url"] = search_backend
            else:
                items["retrieval.backend"] = search_backend
        elif search_backend is not None:
            self.retriever = search_backend  # a Retriever instance
        if search_index is not None:
            items["retrieval.index"] = str(search_index)
        if corpus is not None:
            items["retrieval.corpus"] = str(corpus)
        if topk is not None:
            items["retrieval.topk"] = topk
        if reward_config is not None:
            items["reward.components"] = RewardConfig.from_simple(reward_config).components
        if max_search_turns is not None:
            items["rollout.max_turns"] = max_search_turns
        if group_size is not None:
            items["rollout.n"] = group_size
        if learning_rate is not None:
            items["trainer.actor_lr"] = learning_rate
        if output_dir is not None:
            items["trainer.out_dir"] = str(output_dir)
        if lora_r is not None:
            items["model.lora_r"] = lora_r
        if seed is not None:
            items["seed"] = seed
        self._items = items
        self._extra = [
            *(list(overrides) if isinstance(overrides, Sequence) and not isinstance(overrides, str) else []),
            *([_override(k, v) for k, v in overrides.items()] if isinstance(overrides, Mapping) else []),
        ]
        self.cfg = self._build_config({})
        self.trainer: Any = None

    def _build_config(self, extra: Mapping[str, Any]) -> Any:
        items = {**self._items, **extra}
        return load_config(self.config_path, [*(_override(k, v) for k, v in items.items()), *self._extra])

    def train(
        self,
        train_data: str | Path | Sequence[Any] | None = None,
        num_iterations: int | None = None,
        batch_size: int | None = None,
        val_data: str | Path | Sequence[Any] | None = None,
    ) -> dict[str, Any]:
        """Train; ``train_data`` is a parquet / jsonl path (or several, or a list of samples); None =
        the embedded synthetic world. Returns the run summary (metrics, checkpoint, plots)."""
        from searchr1.trainer.loop import RLTrainer  # torch

        extra: dict[str, Any] = {}
        train_samples = val_samples = None
        if isinstance(train_data, str | Path):
            extra["data.train_files"] = [str(train_data)]
        elif train_data is not None and all(isinstance(x, str | Path) for x in train_data):
            extra["data.train_files"] = [str(x) for x in train_data]
        elif train_data is not None:
            train_samples = list(train_data)
        if isinstance(val_data, str | Path):
            extra["data.val_files"] = [str(val_data)]
        elif val_data is not None:
            val_samples = list(val_data)
        if num_iterations is not None:
            extra["trainer.total_steps"] = num_iterations
        if batch_size is not None:
            extra["trainer.batch_size"] = batch_size
            mini = self.cfg.trainer.mini_batch_size
            if batch_size % mini:
                extra["trainer.mini_batch_size"] = batch_size
        self.cfg = self._build_config(extra)
        self.trainer = RLTrainer(
            self.cfg, retriever=self.retriever, train_samples=train_samples, val_samples=val_samples
        )
        try:
            return self.trainer.train()
        finally:
            self.trainer.close()  # the rollout engine (a vLLM server is stopped); the policy stays

    @property
    def model(self) -> Any:
        """The trained policy (a Hugging Face model; a peft model with LoRA)."""
        return None if self.trainer is None else self.trainer.policy

    @property
    def tokenizer(self) -> Any:
        return None if self.trainer is None else self.trainer.tokenizer

    def save(self, folder: str | Path, best: bool = False) -> Path:
        """Write the policy as a Hugging Face folder (LoRA merged in) that ``from_pretrained`` loads, with the
        prompt template it was trained with (for ``eval`` and ``ask``); with ``best``, the policy of the best
        validation EM kept by ``trainer.keep_best=val_em``."""
        if self.trainer is None:
            raise RuntimeError("train() first")
        from searchr1.trainer.checkpoint import carry_template, export_policy  # torch
        from searchr1.trainer.components import save_policy

        out = Path(folder)
        if best:
            return export_policy(self.trainer.out_dir, out / "model", best=True)[0]
        out.mkdir(parents=True, exist_ok=True)
        save_policy(self.trainer.policy, self.trainer.tokenizer, out, lora=self.trainer.lora)
        carry_template(self.trainer.out_dir, out / "model")  # eval and ask prompt it as it was trained
        return out / "model"
