"""`mqcontroller`: run a controller (state and leadership in etcd) until SIGINT or SIGTERM.

Exit codes: 0 after a clean stop, 1 when the listen address cannot be bound, 2 for a bad
configuration (file, environment or flag).
"""

from __future__ import annotations

import signal
import sys

import click
import structlog
import trio

from common.config import ConfigError
from common.exceptions import exception_leaves
from controller.config import ControllerConfig, load_config
from controller.server import ControllerServer
from remoting.logs import configure_logging

log = structlog.get_logger()


async def serve(config: ControllerConfig) -> None:
    """Run a controller until SIGINT/SIGTERM arrives, then stop it (its leadership lease is
    revoked, so another controller takes over at once)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with ControllerServer(config):
            async for signum in signals:
                log.info("controller_signal", signal=signal.Signals(signum).name)
                break


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--listen", default=None, help="HOST:PORT to listen on [0.0.0.0:9878].")
@click.option("--etcd", "etcd_endpoints", default=None, help="etcd URLs, ';'-separated.")
@click.option(
    "--config",
    "config_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="TOML file of settings (see controller/config.py).",
)
@click.option(
    "--log-level",
    default=None,
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    help="Log level [info].",
)
@click.option("--log-json/--no-log-json", default=None, help="JSON log lines on stderr.")
def main(
    listen: str | None,
    etcd_endpoints: str | None,
    config_file: str | None,
    log_level: str | None,
    log_json: bool | None,
) -> None:
    """Run a trimq controller (RocketMQ 5.x controller mode on etcd)."""
    flags = {
        "listen": listen,
        "etcd_endpoints": etcd_endpoints,
        "log_level": log_level,
        "log_json": log_json,
    }
    try:
        config = load_config(config_file, flags=flags)
    except ConfigError as exc:
        click.echo(f"mqcontroller: {exc}", err=True)
        sys.exit(2)
    configure_logging(config.log_level, json_output=config.log_json)
    try:
        trio.run(serve, config)
    except* OSError as group:
        for err in exception_leaves(group):
            log.error("controller_start_failed", listen=config.listen, error=str(err))  # noqa: TRY400
        sys.exit(1)
    sys.exit(0)
