"""Evaluation: run a model over question sets in the paper's modes and score it per data source.

Reading order (follows the data path):
  modes.py     the modes (direct, cot, rag, agent), their prompts, the questions a sample gives
  runner.py    evaluate() one mode / evaluate_modes() several: batches, generation, records, resume
  aggregate.py per-source means of the records (EM, subEM, F1, valid format, searches, ...)
  tables.py    the per-source table, the paper's layout (methods x datasets + avg), two runs compared
  store.py     the files: trajectories.jsonl per batch, summary.json, results.json, table.md
  progress.py  what ``searchr1 eval`` shows while it runs (the engine's token listener); search failures
  agent.py     ``Agent``: ask a model questions (``searchr1 ask``, ``from searchr1 import Agent``)
  cli.py       ``searchr1 eval``;  ask_cli.py: ``searchr1 ask`` (``searchr1 report``: ``searchr1.report.cli``)

The answers and scores come from ``searchr1.rewards.text`` (Search-R1's normalisation), each
trajectory's record from ``searchr1.rollout.records`` (the model's own tokens by the role mask), and
the baselines' engine is ``searchr1.rollout.single_turn.SingleTurnEngine``. Importing this package
does not import torch.

    summary = evaluate(engine, samples, tokenizer=tok, mode="agent", batch_size=16, out_dir="eval/agent")
    summary["sources"]["nq"]["em"]
"""

from searchr1.evaluation.aggregate import COUNTS, METRICS, aggregate, flatten_summary
from searchr1.evaluation.errors import EvaluationError
from searchr1.evaluation.modes import MODES, Mode, mode_prompt, parse_modes, sample_view
from searchr1.evaluation.runner import BatchProgress, evaluate, evaluate_modes
from searchr1.evaluation.store import (
    RESULTS_FILE,
    STATE_FILE,
    SUMMARY_FILE,
    TABLE_FILE,
    TRAJECTORIES_FILE,
    load_results,
    read_trajectories,
)
from searchr1.evaluation.tables import compare_tables, format_paper_table, format_summary_table, paper_table

__all__ = [
    "COUNTS",
    "METRICS",
    "MODES",
    "RESULTS_FILE",
    "STATE_FILE",
    "SUMMARY_FILE",
    "TABLE_FILE",
    "TRAJECTORIES_FILE",
    "BatchProgress",
    "EvaluationError",
    "Mode",
    "aggregate",
    "compare_tables",
    "evaluate",
    "evaluate_modes",
    "flatten_summary",
    "format_paper_table",
    "format_summary_table",
    "load_results",
    "mode_prompt",
    "paper_table",
    "parse_modes",
    "read_trajectories",
    "sample_view",
]
