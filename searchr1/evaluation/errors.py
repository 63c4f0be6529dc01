"""The evaluation's one error type."""

from __future__ import annotations

from searchr1.errors import UserFacingError


class EvaluationError(UserFacingError, ValueError):
    """Evaluation cannot run or continue as asked; the one-line message names the file, row or setting."""
