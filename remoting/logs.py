"""structlog set-up shared by every trimq process (mqnamesrv, mqbroker, mqadmin, mqbench).

Logs go to stderr as key=value lines by default (coloured console output when
stderr is a terminal) or as one JSON object per line with `json_output=True`
(the CLIs' `--log-json`). Call `configure_logging` once, in the entry point.
"""

from __future__ import annotations

import logging
import sys

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure_logging(level: str = "info", *, json_output: bool = False) -> None:
    """Configure structlog for this process.

    Args:
        level: one of debug, info, warning, error.
        json_output: JSON lines instead of key=value text.

    Raises:
        ValueError: unknown level name.
    """
    try:
        numeric = _LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}; use one of {', '.join(_LEVELS)}") from None
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    renderer: structlog.typing.Processor
    if json_output:
        renderer = structlog.processors.JSONRenderer()
    elif sys.stderr.isatty():
        renderer = structlog.dev.ConsoleRenderer()
    else:
        renderer = structlog.processors.KeyValueRenderer(
            key_order=["timestamp", "level", "event"], drop_missing=True
        )
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def configure_logging_if_unset(level: str = "warning") -> None:
    """Configure structlog with `level` unless the application already configured it.

    Library entry points (the client's `ClientInstance`) call this so that an application
    which never configured logging does not get structlog's default of printing every
    debug line.
    """
    if not structlog.is_configured():
        configure_logging(level)
