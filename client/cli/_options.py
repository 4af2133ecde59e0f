"""Options shared by the command-line tools."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from client.config import SERIALIZE_TYPE_NAMES


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
