"""The retrieval and rollout settings a policy was trained with, found from its model folder the way its
prompt template is (``searchr1.data.trained_template``), so that ``eval`` and ``ask`` give a checkpoint
the documents, turns and token budgets it learned with (``searchr1.cli_common.choose_settings``).

A policy trained with one passage a search and two turns of 64 tokens is lost under four turns of 500
tokens and three passages: it keeps searching, or answers after text it never saw in training.

Where they are read, in this order (the first that has them):

    <model>/searchr1_template.json      an exported policy: its ``settings``; a record of an older
                                        version has none, so its ``run``'s config.yaml, if still there
    <model>/../config.yaml              a checkpoint's own copy of the run configuration
    <run>/config.yaml                   the run of ``checkpoints/<any>/model`` or ``warmstart/model``

Only ``SETTING_KEYS`` are taken: what changes what the policy sees or may do. The engine, the dtype and
the sampling are the command's own (``eval`` decodes greedily).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from searchr1.data.trained_template import RUN_CONFIG, TEMPLATE_FILE, read_export_record, run_configs

SETTING_KEYS: tuple[str, ...] = (
    "retrieval.topk",
    "rollout.max_turns",
    "rollout.max_turn_tokens",
    "rollout.max_obs_tokens",
    "rollout.max_response_tokens",
    "rollout.max_context",
    "rollout.last_search_notice",
    "rollout.invalid_action_message",
    "rollout.eos_ends_trajectory",
    "rollout.max_query_chars",
)
"""The settings a policy is evaluated with as it was trained (dotted config keys): passages per search,
turns, the token budgets of a turn, an observation, a response and the context, the notice after the
last search turn, the invalid-action message, whether EOS ends a trajectory, and the query length."""


@dataclass(frozen=True)
class TrainedSettings:
    """The settings a policy was trained with."""

    values: dict[str, Any]
    """Dotted key -> value, for the ``SETTING_KEYS`` the record has (an older run may lack some)."""
    source: Path
    """The file that said so (a run's ``config.yaml`` or an export's ``searchr1_template.json``)."""


def _lookup(data: dict[str, Any], key: str) -> tuple[bool, Any]:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def pick_settings(data: dict[str, Any]) -> dict[str, Any]:
    """The ``SETTING_KEYS`` of a configuration (nested sections) that it has."""
    picked = {}
    for key in SETTING_KEYS:
        has, value = _lookup(data, key)
        if has and value is not None:
            picked[key] = value
    return picked


def settings_of_config(config_path: Path) -> TrainedSettings | None:
    """The settings of a run's ``config.yaml`` (None when the file is not a run's configuration)."""
    try:
        data = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("rollout"), dict):
        return None
    values = pick_settings(data)
    return TrainedSettings(values, config_path) if values else None


def _settings_of_export(folder: Path) -> TrainedSettings | None:
    path = folder / TEMPLATE_FILE
    info = read_export_record(folder)
    if info is None:
        return None
    recorded = info.get("settings")
    if isinstance(recorded, dict):
        values = {k: v for k, v in recorded.items() if k in SETTING_KEYS and v is not None}
        return TrainedSettings(values, path) if values else None
    run = info.get("run")  # a record written before settings were: the run's config, where it still is
    if isinstance(run, str) and run and (Path(run) / RUN_CONFIG).is_file():
        return settings_of_config(Path(run) / RUN_CONFIG)
    return None


def find_trained_settings(model: str | Path) -> TrainedSettings | None:
    """The settings the policy in the folder ``model`` was trained with (see the module docstring), or
    None for a model that no run of this package wrote (an alias, a hub id, a folder of its own)."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return None
    if (folder / TEMPLATE_FILE).is_file():
        return _settings_of_export(folder)
    for config, _ in run_configs(folder):
        found = settings_of_config(config)
        if found is not None:
            return found
    return None


def run_settings(run_dir: str | Path, checkpoint: str | Path | None = None) -> dict[str, Any]:
    """The settings of a run folder (its ``config.yaml``, else ``checkpoint``'s), for the export record;
    empty when neither is there."""
    run = Path(run_dir)
    for config in (run / RUN_CONFIG, *([Path(checkpoint) / RUN_CONFIG] if checkpoint else [])):
        found = settings_of_config(config) if config.is_file() else None
        if found is not None:
            return dict(found.values)
    return {}
