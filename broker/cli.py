"""`mqbroker`: run one broker.

    mqbroker -n 127.0.0.1:9876 --listen 127.0.0.1:10911 --store-dir ./.trimq

Settings come from defaults < `--config FILE` (TOML) < `TRIMQ_*` environment < flags. An invalid
setting prints one clear line and exits with status 2. SIGTERM or SIGINT stops the broker
cleanly (unregister, persist, close the store); a second signal stops at once.
"""

from __future__ import annotations

import gc
import signal
import sys
from typing import Any

import click
import structlog
import trio

from broker.config import BrokerConfig, ConfigError, load_config
from broker.controller import BrokerController
from remoting.logs import configure_logging

log = structlog.get_logger()


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
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML file.")
@click.option(
    "--log-level", type=click.Choice(["debug", "info", "warning", "error"]), help="Log level."
)
@click.option("--log-json/--no-log-json", default=None, help="JSON log lines.")
def cli(config_file: str | None, **flags: Any) -> None:
    """Run a trimq broker (RocketMQ 4.x protocol)."""
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
    except OSError as exc:
        log.error("broker_failed", error=str(exc))  # noqa: TRY400
        sys.exit(1)
    except BaseExceptionGroup as group:  # trio wraps task errors
        first = _first_os_error(group)
        if first is None:
            raise
        log.error("broker_failed", error=str(first))  # noqa: TRY400
        sys.exit(1)


def _first_os_error(exc: BaseException) -> OSError | None:
    """The first OSError in a (nested) exception group, e.g. a port already in use."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first_os_error(inner)
            if found is not None:
                return found
    return None


def main() -> None:
    """Entry point of the `mqbroker` script."""
    cli()


if __name__ == "__main__":
    main()
