"""Errors raised while authoring a policy (at declaration) and by a policy at inference time.

    Exception
    ├── ValueError ─┬─ DeclarationError      a @seq.policy declaration that cannot be served
    ├── TypeError  ─┘                         (names the argument and how to fix it)
    └── ValueError ── PolicyInputError        raised by infer(): the request cannot be acted on;
                                              the worker answers 400 invalid_request with its message
"""
from __future__ import annotations

__all__ = ["DeclarationError", "PolicyInputError"]


class DeclarationError(ValueError, TypeError):
    """A policy declaration is malformed.

    Raised when ``@seq.policy(...)``, a contract or a lifecycle marker is given something the
    worker could not serve. It is both a ValueError and a TypeError so that either ``except``
    catches it. ``argument`` names what is wrong and ``fix`` says what to write instead.
    """

    def __init__(self, argument: str, problem: str, fix: str | None = None):
        self.argument = argument
        self.problem = problem
        self.fix = fix
        message = f"{argument}: {problem}"
        if fix:
            message += f" -- {fix}"
        super().__init__(message)


class PolicyInputError(ValueError):
    """Raised by a policy's infer() when the observation or parameters cannot be acted on.

    The worker turns it into ``400 invalid_request`` carrying this message, so the caller can
    tell a bad request (its fault) from a policy crash (``500 policy_error``).
    """
