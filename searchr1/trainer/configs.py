"""The configs shipped with the package (``searchr1/configs/*.yaml``), selectable by name.

searchr1 train --config tiny_cpu            # same as --config <package>/configs/tiny_cpu.yaml
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
