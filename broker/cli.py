"""`mqbroker`: run one broker.

    mqbroker -n 127.0.0.1:9876 --listen 127.0.0.1:10911 --store-dir ./.trimq

Settings come from defaults < `--config FILE` (TOML) < `TRIMQ_*` environment < flags. An invalid
setting prints one clear line and exits with status 2. SIGTERM or SIGINT stops the broker
cleanly (unregister, persist, close the store); a second signal stops at once.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from typing import Any, TypeVar

import click
import structlog
import trio

from broker.config import BrokerConfig, ConfigError, load_config
from broker.controller import BrokerController
from broker.metrics import MetricsListenError
from remoting.logs import configure_logging

log = structlog.get_logger()

E = TypeVar("E", bound=BaseException)


async def _serve(config: BrokerConfig) -> None:
    controller = BrokerController(config)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                count = 0
                async for signum in signals:
                    count += 1
                    log.info("broker_signal", signal=signal.Signals(signum).name)
                    if count == 1:
                        controller.stop()
                    else:
                        nursery.cancel_scope.cancel()

            nursery.start_soon(watch)

            async def run(*, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
                await controller.run(task_status=task_status)
                nursery.cancel_scope.cancel()

            await nursery.start(run)
            freeze_startup_heap()


def freeze_startup_heap() -> None:
    """Collect once, then move every object alive now out of the garbage collector's reach.

    The start-up heap (imports, configuration, topic tables) lives as long as the process, yet
    every full collection would rescan it on the event loop; frozen, collections scan only what
    serving allocates. A process entry point's decision, not the controller's: embedded brokers
    (tests) leave their host's heap alone (docs/design-notes.md, "Start-up heap freeze").
    """
    gc.collect()
    gc.freeze()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-n", "--namesrv-addr", "namesrv_addr", help="NameServer addresses, ';'-separated.")
@click.option("--name", "broker_name", help="Broker name (default broker-a).")
@click.option("--cluster", "broker_cluster_name", help="Cluster name (default DefaultCluster).")
@click.option("--id", "broker_id", type=int, help="Broker id; 0 is the master.")
@click.option("--listen", help="Listen address HOST:PORT (default 0.0.0.0:10911).")
@click.option("--advertise", help="Address published to NameServers (HOST:PORT).")
@click.option("--store-dir", "store_dir", help="Store root directory (default ~/store).")
@click.option(
    "--flush", "flush_disk_type", type=click.Choice(["sync", "async"]), help="Flush mode."
)
@click.option(
    "--role",
    "broker_role",
    type=click.Choice(["ASYNC_MASTER", "SYNC_MASTER", "SLAVE"], case_sensitive=False),
    help="Replication role (default ASYNC_MASTER); a SLAVE needs --id > 0.",
)
@click.option("--ha-port", "ha_listen_port", type=int, help="HA listen port (default listen + 1).")
@click.option(
    "--auto-create-topic/--no-auto-create-topic",
    "auto_create_topic_enable",
    default=None,
    help="Create topics on first send from TBW102.",
)
@click.option(
    "--metrics-listen",
    "metrics_listen",
    help="Prometheus /metrics address HOST:PORT (default 127.0.0.1:5557; '' turns it off).",
)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML file.")
@click.option(
    "--log-level", type=click.Choice(["debug", "info", "warning", "error"]), help="Log level."
)
@click.option("--log-json/--no-log-json", default=None, help="JSON log lines.")
def cli(config_file: str | None, **flags: Any) -> None:
    """Run a trimq broker (RocketMQ 4.x protocol)."""
    if config_file is not None:
        # updateBrokerConfig persists runtime changes to the file the broker was started with.
        flags["broker_config_path"] = os.path.abspath(config_file)
    try:
        config = load_config(config_file, flags=flags)
    except ConfigError as exc:
        click.echo(f"mqbroker: {exc}", err=True)
        sys.exit(2)
    try:
        configure_logging(config.log_level, json_output=config.log_json)
    except ValueError as exc:
        click.echo(f"mqbroker: {exc}", err=True)
        sys.exit(2)
    # Process-wide, so the entry point's decision (as `freeze_startup_heap`): embedded brokers
    # (tests) leave their host's interpreter alone.
    sys.setswitchinterval(config.switch_interval_s)
    try:
        trio.run(_serve, config)
    except KeyboardInterrupt:
        pass
    except (MetricsListenError, BaseExceptionGroup) as exc:
        metrics = _first_of(exc, MetricsListenError)
        if metrics is not None:
            # An explicit setting that cannot be honoured: a configuration error.
            log.error("broker_failed", error=str(metrics))  # noqa: TRY400
            click.echo(f"mqbroker: {metrics}", err=True)
            sys.exit(2)
        first = _first_os_error(exc)
        if first is None:
            raise
        log.error("broker_failed", error=str(first))  # noqa: TRY400
        sys.exit(1)
    except OSError as exc:
        log.error("broker_failed", error=str(exc))  # noqa: TRY400
        sys.exit(1)


def _first_os_error(exc: BaseException) -> OSError | None:
    """The first OSError in a (nested) exception group, e.g. a port already in use."""
    return _first_of(exc, OSError)


def _first_of(exc: BaseException, kind: type[E]) -> E | None:
    """The first `kind` in `exc` or a (nested) exception group of it (trio wraps task
    errors)."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first_of(inner, kind)
            if found is not None:
                return found
    return None


def main() -> None:
    """Entry point of the `mqbroker` script."""
    cli()


if __name__ == "__main__":
    main()
