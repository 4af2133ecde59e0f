"""`mqdashboard -n NAMESRV_ADDR --listen 127.0.0.1:8080`: the web dashboard (docs/dashboard.md)."""

from __future__ import annotations

import signal
import sys
from typing import Any

import click
import structlog
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from client.admin import Admin
from client.cli._options import (
    client_config,
    credentials,
    credentials_options,
    serialize_type_option,
    tls,
    tls_options,
)
from dashboard.app import Dashboard, Login, create_app, find_chartjs
from dashboard.history import History, run_sampler
from remoting.logs import configure_logging

log = structlog.get_logger()

USER_ENV = "TRIMQ_DASHBOARD_USER"
PASSWORD_ENV = "TRIMQ_DASHBOARD_PASSWORD"


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 hosts in brackets).

    Raises:
        click.BadParameter: not that form, or a port outside 1..65535.
    """
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{value!r}: give HOST:PORT, e.g. 127.0.0.1:8080")
    return host, int(port)


@click.command()
@click.option(
    "-n",
    "--namesrv-addr",
    "--namesrvAddr",
    "namesrv_addr",
    envvar="NAMESRV_ADDR",
    required=True,
    help="NameServer address(es), ';'-separated (default: $NAMESRV_ADDR).",
)
@click.option(
    "--listen",
    default="127.0.0.1:8080",
    show_default=True,
    envvar="TRIMQ_DASHBOARD_LISTEN",
    help="HOST:PORT to serve on. Keep it on loopback unless a login or a proxy guards it.",
)
@click.option(
    "--user",
    envvar=USER_ENV,
    default=None,
    help=f"Require a login with this user (and ${PASSWORD_ENV}).",
)
@click.option(
    "--password",
    envvar=PASSWORD_ENV,
    default=None,
    help=f"The login's password (prefer ${PASSWORD_ENV}: a flag shows in `ps`).",
)
@click.option(
    "--cookie-secure/--no-cookie-secure",
    default=False,
    help="Mark cookies Secure (when served over HTTPS by a proxy).",
)
@click.option(
    "--sample-interval",
    type=click.FloatRange(0.5, 3600),
    default=5.0,
    show_default=True,
    help="Seconds between samples of TPS and lag for the live charts.",
)
@click.option(
    "--history",
    "history_size",
    type=click.IntRange(1, 100_000),
    default=120,
    show_default=True,
    help="Samples kept in memory (the charts' span is this times the interval).",
)
@click.option(
    "--chartjs",
    type=click.Path(dir_okay=False),
    default=None,
    help="Chart.js UMD file to serve (default: Debian's libjs-chart.js).",
)
@click.option("--log-level", default="info", show_default=True, help="Log level.")
@serialize_type_option
@credentials_options
@tls_options
def main(
    namesrv_addr: str,
    listen: str,
    user: str | None,
    password: str | None,
    cookie_secure: bool,
    sample_interval: float,
    history_size: int,
    chartjs: str | None,
    log_level: str,
    serialize_type: str,
    access_key: str | None,
    secret_key: str | None,
    **tls_values: Any,
) -> None:
    """trimq web dashboard: cluster, topics, consumer groups, messages, live charts.

    With ACL on, it signs every request as --access-key/--secret-key (TRIMQ_ACCESS_KEY,
    TRIMQ_SECRET_KEY); --user with TRIMQ_DASHBOARD_PASSWORD turns its own login on.
    """
    configure_logging(log_level)
    host, port = parse_listen(listen)
    if bool(user) != bool(password):
        raise click.UsageError(f"--user and --password ({PASSWORD_ENV}) go together")
    config = client_config(
        namesrv_addr=namesrv_addr,
        serialize_type=serialize_type,
        **credentials(access_key, secret_key),
        **tls(tls_values),
    )
    chart_path = find_chartjs(chartjs)
    if chartjs and chart_path is None:
        raise click.BadParameter(f"{chartjs}: no such file", param_hint="--chartjs")
    if chart_path is None:
        log.warning("chartjs_not_found", hint="apt-get install libjs-chart.js, or --chartjs")
    login = Login(user, password) if user and password else None
    if login is None and host not in ("127.0.0.1", "localhost", "::1", "[::1]"):
        log.warning("dashboard_without_login", listen=listen, hint="set --user or use a proxy")

    async def run() -> None:
        async with Admin(config) as admin:
            history = History(history_size)
            dash = Dashboard(
                admin=admin,
                history=history,
                login=login,
                chartjs=chart_path,
                cookie_secure=cookie_secure,
                sample_interval_s=sample_interval,
            )
            hc = HypercornConfig()
            hc.bind = [f"{host}:{port}"]
            hc.accesslog = None
            hc.graceful_timeout = 2.0
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_sampler, admin, history, sample_interval)
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:

                    async def stop() -> None:
                        async for _ in signals:
                            return

                    await serve(create_app(dash), hc, shutdown_trigger=stop)  # type: ignore[arg-type]
                nursery.cancel_scope.cancel()

    log.info("dashboard_starting", listen=f"http://{host}:{port}/", namesrv=namesrv_addr)
    try:
        trio.run(run)
    except OSError as exc:
        click.echo(f"mqdashboard: cannot serve on {listen}: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        pass
    log.info("dashboard_stopped")
