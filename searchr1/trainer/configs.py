"""The configs shipped with the package (``searchr1/configs/*.yaml``), selectable by name.

searchr1 train --config tiny_cpu            # same as --config <package>/configs/tiny_cpu.yaml
SearchR1Trainer(config="tiny_cpu")          # the Python API resolves names the same way
"""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def shipped_configs() -> dict[str, Path]:
    """Name (file stem) -> path of every shipped config."""
    return {p.stem: p for p in sorted(CONFIG_DIR.glob("*.yaml"))}


def shipped_config(name: str) -> Path | None:
    """The shipped config called ``name`` (with or without ``.yaml``), or None."""
    return shipped_configs().get(name.removesuffix(".yaml"))


def resolve_config_path(path: str | Path | None) -> str | None:
    """A config file path, or the name of a shipped config (``tiny_cpu``, ``grpo_qwen2.5_3b``, ...);
    anything else is returned as given (``load_config`` then says the file is missing)."""
    if path is None:
        return None
    path = str(path)
    if Path(path).is_file():
        return path
    found = shipped_config(path)
    return str(found) if found else path
