"""`mqnamesrv`: run a NameServer until SIGINT or SIGTERM.

Exit codes: 0 after a clean stop, 1 when the listen address cannot be bound,
2 for a bad configuration (file, environment or flag), or a `metrics_listen` set explicitly
that cannot be bound.
"""

from __future__ import annotations

import signal
import sys

import click
import structlog
import trio

from common.exceptions import exception_leaves
from namesrv.config import ConfigError, NamesrvConfig, load_config
from namesrv.metrics import MetricsListenError
from namesrv.server import NameServer
from remoting.logs import configure_logging

log = structlog.get_logger()


async def serve(config: NamesrvConfig) -> None:
    """Run a NameServer until SIGINT/SIGTERM arrives, then stop it cleanly."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with NameServer(config):
            async for signum in signals:
                log.info("namesrv_signal", signal=signal.Signals(signum).name)
                break


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--listen", default=None, help="HOST:PORT to listen on [127.0.0.1:9876].")
@click.option(
    "--config",
    "config_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="TOML file of settings (see namesrv/config.py).",
)
@click.option(
    "--log-level",
    default=None,
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    help="Log level [info].",
)
@click.option("--log-json/--no-log-json", default=None, help="JSON log lines on stderr.")
@click.option(
    "--metrics-listen",
    default=None,
    help="Prometheus /metrics address HOST:PORT [127.0.0.1:5558]; '' turns it off.",
)
def main(
    listen: str | None,
    config_file: str | None,
    log_level: str | None,
    log_json: bool | None,
    metrics_listen: str | None,
) -> None:
    """Run a trimq NameServer (RocketMQ 4.x protocol)."""
    flags = {
        "listen": listen,
        "log_level": log_level,
        "log_json": log_json,
        "metrics_listen": metrics_listen,
    }
    try:
        config = load_config(config_file, flags=flags)
    except ConfigError as exc:
        click.echo(f"mqnamesrv: {exc}", err=True)
        sys.exit(2)
    configure_logging(config.log_level, json_output=config.log_json)
    try:
        trio.run(serve, config)
    except* MetricsListenError as group:
        for err in exception_leaves(group):
            log.error("namesrv_start_failed", error=str(err))  # noqa: TRY400
            click.echo(f"mqnamesrv: {err}", err=True)
        sys.exit(2)
    except* OSError as group:
        for err in exception_leaves(group):
            log.error("namesrv_start_failed", listen=config.listen, error=str(err))  # noqa: TRY400
        sys.exit(1)
    sys.exit(0)
