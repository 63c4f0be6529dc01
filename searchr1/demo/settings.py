"""What one demo run is made of: its settings, its prompt files and the RL configuration of each run."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchr1.models import DEFAULT_MODEL

CONFIG_NAME = "demo_learning"
"""The shipped RL config of the demo (``searchr1/configs/demo_learning.yaml``)."""
PROMPT_FILE = "prompt.json"
ZERO_SHOT_PROMPT_FILE = "prompt_zero_shot.json"
NQ_QUESTIONS, NQ_CORPUS = "nq_test_sample.jsonl", "wiki18_sample_corpus.jsonl"
SUMMARY_FILE = "summary.json"
DEFAULT_TEMPLATE = "instruct_2hop"
"""The demo's prompt: Search-R1's instruction and two two-search worked examples."""


@dataclass
class DemoSettings:
    """One demo run (``quick`` keeps one seed and the search run)."""

    seeds: tuple[int, ...] = (0, 1, 2)
    """World and RL seeds; one search run and one control run per seed."""
    algorithm: str = "grpo"
    """grpo | ppo | rloo | reinforce | reinforce_plus_plus."""
    steps: int = 0
    """RL steps per run (0 = the config's ``trainer.total_steps``)."""
    num_test: int = 64
    """Held-out test questions evaluated before and after."""
    world: dict[str, Any] = field(
        default_factory=lambda: {
            "filler_sentences": 0,
            "hop_mix": {"single": 0.75, "bridge": 0.25},
            "num_entities": 300,
            "num_train": 340,
            "train_hop_mix": {"single": 0.5, "bridge": 0.5},
        }
    )
    """SynthConfig knobs of the demo worlds (the seed comes from ``seeds``). Held-out questions are 3/4
    single-hop; training questions half bridge questions, so that a step holds enough two-search
    questions for the second search to be rewarded."""
    model: str = DEFAULT_MODEL
    """The starting model (any name ``searchr1.models.resolve_model`` accepts)."""
    template: str = DEFAULT_TEMPLATE
    """The prompt template (``data.template``)."""
    no_search: bool = True
    """Also run the search-disabled control."""
    zero_shot_template: str = "instruct"
    """The first seed's zero-shot row (``""``: none)."""
    nq_sample: str = "auto"
    """Folder of the FlashRAG sample (``nq_test_sample.jsonl``, ``wiki18_sample_corpus.jsonl``) the first
    seed's policy is evaluated on; ``auto`` looks for ``shared/data/flashrag-sample`` beside or above
    the working directory and this package; ``""``: none."""
    overrides: list[str] = field(default_factory=list)
    """Extra dotted config overrides for the RL runs (``rollout.n=4`` ...)."""
    jobs: int = 1
    """Runs trained at the same time, each in its own process pinned to its share of the CPU cores."""

    @classmethod
    def quick_settings(cls) -> DemoSettings:
        return cls(seeds=(0,), num_test=48, no_search=False, zero_shot_template="", nq_sample="")


def rl_config(
    settings: DemoSettings,
    seed: int,
    out_dir: Path,
    prompt_path: Path,
    model_dir: Path | None = None,
    extra: Sequence[str] = (),
) -> Any:
    """The RL configuration of one run: the shipped demo config plus the run's own keys."""
    from searchr1.config import load_config, shipped_config

    path = shipped_config(CONFIG_NAME)
    if path is None:
        raise FileNotFoundError(f"shipped config {CONFIG_NAME}.yaml is missing")
    overrides = [
        f"seed={seed}",
        f"trainer.out_dir={out_dir}",
        f"data.template={prompt_path}",
        *([f"model.path={model_dir}"] if model_dir is not None else []),  # the PPO critic starts from it
        *algorithm_overrides(settings.algorithm),
        *settings.overrides,
        *extra,
    ]
    if settings.steps:
        overrides.append(f"trainer.total_steps={settings.steps}")
    return load_config(path, overrides)


def algorithm_overrides(name: str) -> list[str]:
    """The advantage estimator of an algorithm's common name (``searchr1.algorithms.presets``); the rest
    of the demo's recipe stays (a critic, when the estimator needs one, trains from the first step and
    replaces the group filter)."""
    from searchr1.algorithms.presets import ALGORITHM_PRESETS, KNOWN_ALGORITHMS
    from searchr1.algorithms.registry import advantage_traits

    if name not in ALGORITHM_PRESETS:
        raise ValueError(f"--algorithm: expected one of {', '.join(KNOWN_ALGORITHMS)}, got {name!r}")
    advantage = ALGORITHM_PRESETS[name]["algorithm.advantage"]
    # a critic baseline gives a group of equal rewards advantages too: no group filter then
    critic = ["trainer.critic_warmup_steps=0", "algorithm.filter_groups=false"]
    return [f"algorithm.advantage={advantage}", *(critic if advantage_traits(advantage).needs_critic else [])]


def write_prompt(out: Path, template: str, name: str = PROMPT_FILE) -> Path:
    """The prompt of a template as chat messages (``{question}`` marks the question) in ``out/name``."""
    from searchr1.data.prompts import prompt_messages

    path = out / name
    path.write_text(json.dumps(prompt_messages("{question}", template), indent=2) + "\n")
    return path


def check_settings(out: Path, settings: DemoSettings) -> Path:
    """Write the prompt and build the RL config once (a bad key fails here, before any model is
    loaded); returns the prompt file."""
    if not settings.seeds:
        raise ValueError("at least one seed is needed")
    out.mkdir(parents=True, exist_ok=True)
    prompt_path = write_prompt(out, settings.template)
    if settings.zero_shot_template:
        write_prompt(out, settings.zero_shot_template, ZERO_SHOT_PROMPT_FILE)
    rl_config(settings, settings.seeds[0], out / f"seed_{settings.seeds[0]}" / "search", prompt_path)
    if settings.nq_sample not in ("", "auto") and not Path(settings.nq_sample).is_dir():
        raise ValueError(f"--nq-sample: no folder {settings.nq_sample}")
    return prompt_path


def find_nq_sample(setting: str) -> Path | None:
    """The FlashRAG sample folder of ``DemoSettings.nq_sample`` (None when absent or turned off)."""
    if not setting:
        return None
    if setting != "auto":
        return Path(setting)
    here = Path(__file__).resolve().parent
    for folder in (Path.cwd(), *Path.cwd().parents, *here.parents):
        candidate = folder / "shared" / "data" / "flashrag-sample"
        if (candidate / NQ_QUESTIONS).is_file() and (candidate / NQ_CORPUS).is_file():
            return candidate
    return None
