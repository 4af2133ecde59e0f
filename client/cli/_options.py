"""Options shared by the command-line tools."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from client.config import ACCESS_KEY_ENV, SECRET_KEY_ENV, SERIALIZE_TYPE_NAMES


def serialize_type_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """`--serialize-type auto|json|rocketmq|msgpack` (`ClientConfig.serialize_type`)."""
    return click.option(
        "--serialize-type",
        "--serializeType",
        "serialize_type",
        type=click.Choice(SERIALIZE_TYPE_NAMES, case_sensitive=False),
        default="auto",
        show_default=True,
        envvar="TRIMQ_CLIENT_SERIALIZE_TYPE",
        help=(
            "Header codec. auto: JSON, moved to trimq's msgpack when the server is trimq; "
            "json or rocketmq: RocketMQ's codecs, for any broker; msgpack: trimq only."
        ),
    )(f)


def credentials_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """`--access-key` / `--secret-key` (`ClientConfig.access_key` / `secret_key`): sign every
    request for a cluster with ACL on. Default: TRIMQ_ACCESS_KEY / TRIMQ_SECRET_KEY (the
    environment keeps the secret out of the process list)."""
    f = click.option(
        "--secret-key",
        "--secretKey",
        "secret_key",
        envvar=SECRET_KEY_ENV,
        default=None,
        metavar="KEY",
        help="ACL secret key (prefer the environment variable: a flag shows in `ps`).",
    )(f)
    return click.option(
        "--access-key",
        "--accessKey",
        "access_key",
        envvar=ACCESS_KEY_ENV,
        default=None,
        metavar="KEY",
        help="ACL account: sign every request with it (RocketMQ plain ACL).",
    )(f)


def credentials(access_key: str | None, secret_key: str | None) -> dict[str, Any]:
    """The `ClientConfig` options for the given credentials (none when both are unset, so the
    config's own defaults apply).

    Raises:
        click.UsageError: only one of the two is given.
    """
    if not access_key and not secret_key:
        return {}
    if not access_key or not secret_key:
        raise click.UsageError(
            "--access-key and --secret-key go together (or TRIMQ_ACCESS_KEY and TRIMQ_SECRET_KEY)"
        )
    return {"access_key": access_key, "secret_key": secret_key}
