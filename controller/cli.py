"""`mqcontroller`: run a controller (state and leadership in etcd) until SIGINT or SIGTERM.

Exit codes: 0 after a clean stop, 1 when the listen address cannot be bound, 2 for a bad
configuration (file, environment or flag), a TLS file that does not load or a bad ACL file.

Every setting of `controller/config.py` may be given in the TOML file (`--config`) or as a
`TRIMQ_<NAME>` variable, the TLS and ACL ones included (`TRIMQ_TLS_MODE=enforcing`,
`TRIMQ_TLS_SERVER_CERT_PATH`, `TRIMQ_ACL_ENABLE=true`, `TRIMQ_ACL_FILE`,
`TRIMQ_ACL_ACCESS_KEY` / `TRIMQ_ACL_SECRET_KEY`, ...), as for mqbroker and mqnamesrv.
"""

from __future__ import annotations

import signal
import sys

import click
import structlog
import trio

from common.acl import AclFileError
from common.config import ConfigError
from common.exceptions import exception_leaves
from controller.config import ControllerConfig, load_config
from controller.server import ControllerServer
from remoting.logs import configure_logging
from remoting.tls import TlsConfigError

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
@click.option(
    "--tls-mode",
    default=None,
    type=click.Choice(["disabled", "permissive", "enforcing"], case_sensitive=False),
    help="TLS on the listening port [disabled]; with tls_server_cert_path (file or env).",
)
@click.option(
    "--acl/--no-acl",
    "acl_enable",
    default=None,
    help="Check every request against acl_file (file or TRIMQ_ACL_FILE).",
)
def main(
    listen: str | None,
    etcd_endpoints: str | None,
    config_file: str | None,
    log_level: str | None,
    log_json: bool | None,
    tls_mode: str | None,
    acl_enable: bool | None,
) -> None:
    """Run a trimq controller (RocketMQ 5.x controller mode on etcd)."""
    flags = {
        "listen": listen,
        "etcd_endpoints": etcd_endpoints,
        "log_level": log_level,
        "log_json": log_json,
        "tls_mode": tls_mode.lower() if tls_mode else None,
        "acl_enable": acl_enable,
    }
    try:
        config = load_config(config_file, flags=flags)
    except ConfigError as exc:
        click.echo(f"mqcontroller: {exc}", err=True)
        sys.exit(2)
    configure_logging(config.log_level, json_output=config.log_json)
    try:
        trio.run(serve, config)
    except* (TlsConfigError, AclFileError) as group:
        # Files read at start (certificates, the accounts): a configuration error.
        for err in exception_leaves(group):
            click.echo(f"mqcontroller: {err}", err=True)
        sys.exit(2)
    except* OSError as group:
        for err in exception_leaves(group):
            log.error("controller_start_failed", listen=config.listen, error=str(err))  # noqa: TRY400
        sys.exit(1)
    sys.exit(0)
