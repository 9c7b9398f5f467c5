"""Errors a user can meet: each says what was expected, where, and what to do."""

from __future__ import annotations


class DeepstackError(Exception):
    """An error the command line reports as ``error: ...`` with exit code 2.

    ``hint`` is the fix to try, printed on its own line.
    """

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\nhint: {self.hint}" if self.hint else self.message
