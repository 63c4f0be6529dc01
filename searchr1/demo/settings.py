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
RUN_ROW_FILE = "row.json"
"""Each run's row in its own folder, written as the run ends (so a run cut short keeps the runs it finished)."""
DEFAULT_TEMPLATE = "instruct"
"""The demo's prompt: Search-R1's instruction alone, no worked examples (the warm start teaches the format; the
shorter prompt makes each warm-start step cheaper: ``benchmarks/warmstart_sweep.py``)."""
NO_GUIDANCE_OVERRIDES: tuple[str, ...] = (
    "guidance.off_policy=0",
    "guidance.branched=0",
    "guidance.decision_groups=0",
)
"""What turns the demo's recipe into the ``no_guidance`` ablation: the same recipe without guidance from the
gold path (no gold trajectories, no branched rollouts, no decision groups); applied after every other override."""
OUTCOME_ONLY_OVERRIDES: tuple[str, ...] = (
    "reward.components={search_r1: 1.0}",
    "reward.step_gain=0.0",
    "reward.step_redundancy=0.0",
    "reward.step_superfluous=0.0",
    "replay.enabled=false",
    *NO_GUIDANCE_OVERRIDES,
)
"""What turns the demo's recipe into the outcome-only ablation: the plain Search-R1 reward, without the
gold-coverage term, without the step rewards (credit for each search), without the replay of successful
trajectories and without guidance; dotted config overrides applied after every other one."""
RL_ONLY_OVERRIDES: tuple[str, ...] = ("warmstart.epochs=0",)
"""What turns the demo's recipe into the ``rl_only`` row: the same RL without the warm start."""
RUN_NAMES = ("search", "no_search", "rl_only", "no_guidance", "outcome_only", "zero_shot")
"""The runs of a seed (``--only``): the recipe (its warm start alone is evaluated on the way); its
search-disabled control (the same recipe, its warm start and guidance built from its own empty search
results); RL alone (the recipe without the warm start); the recipe without guidance; the outcome-only ablation; the
zero-shot prompt (first seed)."""
HOTPOTQA_TEST = "test.jsonl"
"""The HotpotQA sample's test questions (``shared/data/hotpotqa-sample``), the transfer row's."""


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
    search: bool = True
    """Run the recipe with search (the demo's main run; ``False`` only to run a control alone)."""
    no_search: bool = True
    """Also run the search-disabled control."""
    rl_only: bool = True
    """Also run RL alone: the recipe without the warm start (``RL_ONLY_OVERRIDES``)."""
    no_guidance: bool = True
    """Also run the recipe without guidance from the gold path (``NO_GUIDANCE_OVERRIDES``)."""
    outcome_only: bool = True
    """Also run the outcome-only ablation: the recipe with ``outcome_only_overrides``."""
    outcome_only_overrides: list[str] = field(default_factory=lambda: list(OUTCOME_ONLY_OVERRIDES))
    """The overrides that make the recipe outcome-only (``OUTCOME_ONLY_OVERRIDES``)."""
    zero_shot_template: str = "instruct"
    """The first seed's zero-shot row (``""``: none)."""
    nq_sample: str = "auto"
    """Folder of the FlashRAG sample (``nq_test_sample.jsonl``, ``wiki18_sample_corpus.jsonl``) the first
    seed's policy is evaluated on; ``auto`` looks for ``shared/data/flashrag-sample`` beside or above
    the working directory and this package; ``""``: none."""
    hotpotqa_sample: str = "auto"
    """Folder of the HotpotQA sample (``test.jsonl`` in HotpotQA's format): the first seed's policy, before and
    after RL, answers its test questions searching BM25 over their own context paragraphs (the transfer row);
    ``auto`` looks for ``shared/data/hotpotqa-sample`` as ``nq_sample`` does; ``""``: none."""
    hotpotqa_questions: int = 128
    """The transfer row's questions: the first N of the sample's test questions (0: all 497)."""
    overrides: list[str] = field(default_factory=list)
    """Extra dotted config overrides for the RL runs (``rollout.n=4`` ...)."""
    jobs: int = 1
    """Runs trained at the same time, each in its own process pinned to its share of the CPU cores."""

    @classmethod
    def quick_settings(cls) -> DemoSettings:
        return cls(
            seeds=(0,), num_test=48, no_search=False, rl_only=False, no_guidance=False, outcome_only=False,
            zero_shot_template="", nq_sample="", hotpotqa_sample="",
        )  # fmt: skip


def rl_config(
    settings: DemoSettings,
    seed: int,
    out_dir: Path,
    prompt_path: Path | str,
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
    from searchr1.data.prompts import template_messages

    path = out / name
    path.write_text(json.dumps(template_messages(template), indent=2) + "\n")
    return path


def validate_settings(settings: DemoSettings) -> None:
    """Every setting checked, nothing written: a ``ValueError`` names the flag or the key."""
    from searchr1.data.prompts import load_template
    from searchr1.data.synth import SynthConfig

    if not settings.seeds:
        raise ValueError("--seeds: at least one seed is needed")
    runs = (
        settings.search,
        settings.no_search,
        settings.rl_only,
        settings.no_guidance,
        settings.outcome_only,
    )
    if not (any(runs) or settings.zero_shot_template):
        raise ValueError("no run left to do (every run of a seed is turned off)")
    if settings.num_test < 1:
        raise ValueError(f"--num-test must be >= 1, got {settings.num_test}")
    if settings.hotpotqa_questions < 0:
        raise ValueError(f"--hotpotqa-questions must be >= 0, got {settings.hotpotqa_questions}")
    if settings.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {settings.jobs}")
    for flag, template in (
        ("--template", settings.template),
        ("zero_shot_template", settings.zero_shot_template),
    ):
        try:
            if template:
                load_template(template)
        except ValueError as exc:
            raise ValueError(f"{flag}: {exc}") from None
    try:
        SynthConfig(seed=settings.seeds[0], **{"num_test": settings.num_test, **settings.world}).validate()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"world: {exc}") from None
    seed = settings.seeds[0]
    out = Path("runs") / "demo-check" / f"seed_{seed}"  # named in the config only, never written
    rl_config(settings, seed, out / "search", settings.template)
    if settings.outcome_only:
        try:
            rl_config(
                settings, seed, out / "outcome_only", settings.template, extra=settings.outcome_only_overrides
            )
        except ValueError as exc:
            raise ValueError(f"outcome_only_overrides: {exc}") from None
    if settings.nq_sample not in ("", "auto") and not Path(settings.nq_sample).is_dir():
        raise ValueError(f"--nq-sample: no folder {settings.nq_sample}")
    if (
        settings.hotpotqa_sample not in ("", "auto")
        and not (Path(settings.hotpotqa_sample) / HOTPOTQA_TEST).is_file()
    ):
        raise ValueError(f"--hotpotqa-sample: no {HOTPOTQA_TEST} in {settings.hotpotqa_sample}")
    resolve_starting_model(settings.model)


def resolve_starting_model(model: str) -> Path:
    """The folder of the starting model (the packaged SmolLM2 is converted once, on first use)."""
    from searchr1.errors import ModelNotFoundError
    from searchr1.models import resolve_model

    try:
        return Path(resolve_model(model))
    except (ModelNotFoundError, OSError, ValueError) as exc:
        raise ValueError(f"--model {model}: {str(exc).splitlines()[0]}") from None


def check_settings(out: Path, settings: DemoSettings) -> Path:
    """Check every setting (a bad key fails here, before anything is written or any model is loaded),
    then write the prompt files into ``out``; returns the prompt file."""
    validate_settings(settings)
    out.mkdir(parents=True, exist_ok=True)
    prompt_path = write_prompt(out, settings.template)
    if settings.zero_shot_template:
        write_prompt(out, settings.zero_shot_template, ZERO_SHOT_PROMPT_FILE)
    return prompt_path


def find_nq_sample(setting: str) -> Path | None:
    """The FlashRAG sample folder of ``DemoSettings.nq_sample`` (None when absent or turned off)."""
    return _find_shared(setting, "flashrag-sample", (NQ_QUESTIONS, NQ_CORPUS))


def find_hotpotqa_sample(setting: str) -> Path | None:
    """The HotpotQA sample folder of ``DemoSettings.hotpotqa_sample`` (None when absent or turned off)."""
    return _find_shared(setting, "hotpotqa-sample", (HOTPOTQA_TEST,))


def _find_shared(setting: str, name: str, files: Sequence[str]) -> Path | None:
    """``setting`` as a folder; ``auto``: ``shared/data/<name>`` beside or above the working directory or
    this package, holding ``files``; ``""``: None."""
    if not setting:
        return None
    if setting != "auto":
        return Path(setting)
    here = Path(__file__).resolve().parent
    for folder in (Path.cwd(), *Path.cwd().parents, *here.parents):
        candidate = folder / "shared" / "data" / name
        if all((candidate / f).is_file() for f in files):
            return candidate
    return None
