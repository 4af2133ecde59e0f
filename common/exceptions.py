"""Exception-group helpers shared by the command-line entry points and the client."""

from __future__ import annotations

__all__ = ["exception_leaves"]


def exception_leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside `exc`, groups flattened (`[exc]` when it is no group)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in exception_leaves(sub)]
    return [exc]
