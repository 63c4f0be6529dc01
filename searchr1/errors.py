"""Errors whose message is the whole story for the user (the CLI prints them in one line, no traceback).

This module imports nothing of the package, so every layer (library or command line) can raise them.
"""

from __future__ import annotations


class UserFacingError(Exception):
    """An error whose message is the whole story for the user (no traceback is shown)."""


class ModelNotFoundError(UserFacingError, FileNotFoundError):
    """A model name that is neither a local folder, an alias, a ``.gguf`` file nor a reachable hub id."""
