"""The prompt template a policy was trained with, found from its model folder, so that ``eval`` and
``ask`` prompt a checkpoint the way it learned (``searchr1.cli_common.choose_template``); its retrieval
and rollout settings are found the same way (``searchr1.data.trained_settings``).

A training run writes its resolved configuration (``data.template`` included, never ``auto``) to
``<run>/config.yaml`` and to each checkpoint's ``config.yaml``; ``train --export`` writes
``searchr1_template.json`` into the exported folder (the export record: the template, with a copy of it
when it is a file, and the run's settings). From a model folder the template is looked up, in this order:

    <model>/searchr1_template.json      an exported policy (``write_trained_template``)
    <model>/../config.yaml              a checkpoint's model/ (``checkpoints/step_000012/model``)
    <model>/../../../config.yaml        the run folder of ``checkpoints/<any>/model`` (``best/`` too)
    <model>/../../config.yaml           the run folder of a warm start's ``<run>/warmstart/model``
                                        (beside ``warmstart.json``; written once ``train`` starts RL)

A template that is a file is found as recorded (an absolute path, or relative to the folder the run
was started in, which ``trainer.out_dir`` tells), else relative to the current folder.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from searchr1.data.prompts import AUTO, TEMPLATES

TEMPLATE_FILE = "searchr1_template.json"
"""The record ``train --export`` writes into an exported policy: ``{"template": ..., "trained_template": ...,
"run": ..., "settings": {...}}`` (``template``: a built-in name, or a file in the exported folder; both
null when the run recorded none; ``settings``: dotted key -> value, absent in records of older versions)."""
RUN_CONFIG = "config.yaml"
CHECKPOINTS = "checkpoints"
WARM_START = "warmstart"
"""The folder of a run's warm start (``<run>/warmstart/model``, with ``warmstart.json`` beside it)."""
WARM_START_SUMMARY = "warmstart.json"


@dataclass(frozen=True)
class TrainedTemplate:
    """The template a policy was trained with."""

    template: str
    """A built-in name or the path of the template file, as ``data.template`` takes it."""
    source: Path
    """The file that said so (a run's ``config.yaml`` or an export's ``searchr1_template.json``)."""
    recorded: str
    """The template as the run recorded it (a file template: its path at training time)."""
    found: bool = True
    """False when the recorded template is a file that is not found here."""


def _read_config(path: Path) -> dict[str, Any] | None:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("data"), dict) else None


def _training_folder(run_dir: Path, out_dir: str | None) -> Path | None:
    """The folder a run was started in: ``run_dir`` without the relative ``trainer.out_dir`` at its end."""
    if not out_dir or Path(out_dir).is_absolute():
        return None
    parts = [p for p in Path(out_dir).parts if p not in (".", "")]
    here = run_dir.resolve()
    if not parts or len(here.parts) <= len(parts) or list(here.parts[-len(parts) :]) != parts:
        return None
    return here.parents[len(parts) - 1]


def _locate(template: str, run_dir: Path | None, out_dir: str | None) -> Path | None:
    """The template file of a recorded ``data.template`` path, or None when it is nowhere here."""
    path = Path(template).expanduser()
    candidates = []
    if not path.is_absolute() and run_dir is not None:
        origin = _training_folder(run_dir, out_dir)
        if origin is not None:
            candidates.append(origin / path)
    candidates.append(path)
    return next((c for c in candidates if c.is_file()), None)


def template_of_config(config_path: Path, run_dir: Path | None) -> TrainedTemplate | None:
    """The ``data.template`` of a run's ``config.yaml`` (None when the file is not a run's config or the
    template is ``auto``)."""
    data = _read_config(config_path)
    if data is None:
        return None
    recorded = data["data"].get("template")
    if not isinstance(recorded, str) or not recorded or recorded == AUTO:
        return None
    if recorded in TEMPLATES:
        return TrainedTemplate(recorded, config_path, recorded)
    out_dir = (data.get("trainer") or {}).get("out_dir") if isinstance(data.get("trainer"), dict) else None
    located = _locate(recorded, run_dir, out_dir)
    if located is None:
        return TrainedTemplate(recorded, config_path, recorded, found=False)
    return TrainedTemplate(str(located), config_path, recorded)


def read_export_record(folder: Path) -> dict[str, Any] | None:
    """The record ``train --export`` wrote into ``folder`` (``TEMPLATE_FILE``); None when absent or unreadable."""
    try:
        info = json.loads((folder / TEMPLATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _template_of_export(folder: Path) -> TrainedTemplate | None:
    path = folder / TEMPLATE_FILE
    info = read_export_record(folder)
    if info is None:
        return None
    template, recorded = info.get("template"), info.get("trained_template")
    if not isinstance(recorded, str) or not recorded:
        return None
    if not isinstance(template, str) or not template:  # the run's template file was not found at export
        return TrainedTemplate(recorded, path, recorded, found=False)
    if template in TEMPLATES:
        return TrainedTemplate(template, path, recorded)
    local = folder / template
    return TrainedTemplate(str(local), path, recorded, found=local.is_file())


def run_configs(model: str | Path) -> list[tuple[Path, Path | None]]:
    """The run configurations that may describe the policy in the folder ``model``, nearest first, each
    with its run folder (None where unknown): the folder's own step ``config.yaml``, then the run's."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return []
    step = folder.parent
    if step.parent.name == CHECKPOINTS:
        run_dir: Path | None = step.parent.parent
    elif step.name == WARM_START and (step / WARM_START_SUMMARY).is_file():
        run_dir = step.parent
    else:
        run_dir = None
    found = [(step / RUN_CONFIG, run_dir)]
    if run_dir is not None:
        found.append((run_dir / RUN_CONFIG, run_dir))
    return [(config, run) for config, run in found if config.is_file()]


def find_trained_template(model: str | Path) -> TrainedTemplate | None:
    """The template the policy in the folder ``model`` was trained with (see the module docstring), or
    None for a model that no run of this package wrote (an alias, a hub id, a folder of its own)."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return None
    exported = _template_of_export(folder)
    if exported is not None:
        return exported
    for config, run_dir in run_configs(folder):
        found = template_of_config(config, run_dir)
        if found is not None:
            return found
    return None


def run_template(run_dir: str | Path, checkpoint: str | Path | None = None) -> TrainedTemplate | None:
    """The template of a run folder: its ``config.yaml``, else ``checkpoint``'s."""
    run = Path(run_dir)
    for config in (run / RUN_CONFIG, *([Path(checkpoint) / RUN_CONFIG] if checkpoint else [])):
        if config.is_file():
            found = template_of_config(config, run)
            if found is not None:
                return found
    return None


def write_trained_template(
    folder: str | Path,
    trained: TrainedTemplate | None,
    run_dir: str | Path,
    settings: dict[str, Any] | None = None,
) -> Path:
    """Write the export record of the policy in ``folder`` (``searchr1_template.json``): the template it
    was trained with (``trained``; None: the run recorded none) and the run's retrieval and rollout
    ``settings`` (``searchr1.data.trained_settings``). A template file is copied in beside it, so that the
    folder carries its prompt wherever it goes; one that is not found is recorded by its name only
    (``template``: null), so that ``eval`` says so."""
    target = Path(folder)
    template: str | None = None if trained is None else trained.template
    if trained is not None and template not in TEMPLATES:
        if trained.found:
            source = Path(trained.template)
            template = f"searchr1_template{source.suffix}"
            shutil.copyfile(source, target / template)
        else:
            template = None
    info: dict[str, Any] = {
        "template": template,
        "trained_template": None if trained is None else trained.recorded,
        "run": str(run_dir),
    }
    if settings:
        info["settings"] = settings
    path = target / TEMPLATE_FILE
    path.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return path
