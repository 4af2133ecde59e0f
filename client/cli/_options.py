"""Options shared by the command-line tools."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click
from pydantic import ValidationError

from client.config import (
    ACCESS_KEY_ENV,
    SECRET_KEY_ENV,
    SERIALIZE_TYPE_NAMES,
    USE_TLS_ENV,
    ClientConfig,
)


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


def tls_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """`--tls` and the `--tls-*` options (`ClientConfig.use_tls` and `tls_*`; docs/security.md,
    "TLS"). Unset options keep the config's defaults (TRIMQ_USE_TLS, TRIMQ_TLS_* variables)."""
    options = [
        click.option(
            "--tls/--no-tls",
            "--useTLS",
            "use_tls",
            default=None,
            help=f"Connect with TLS (RocketMQ's useTLS). Default: ${USE_TLS_ENV}, else off.",
        ),
        click.option(
            "--tls-trust-cert",
            "tls_trust_cert_path",
            default=None,
            metavar="PEM",
            help="CA certificates the servers' must chain to (default: the system's).",
        ),
        click.option(
            "--tls-verify-server/--tls-no-verify-server",
            "tls_verify_server",
            default=None,
            help=(
                "Verify the server's certificate (default). --tls-no-verify-server trusts any, "
                "as RocketMQ's default tls.client.authServer=false: encrypted, not authenticated."
            ),
        ),
        click.option(
            "--tls-check-hostname/--tls-no-check-hostname",
            "tls_check_hostname",
            default=None,
            help="The certificate must name the host (default); or check the chain only.",
        ),
        click.option(
            "--tls-server-name",
            "tls_server_hostname",
            default=None,
            metavar="NAME",
            help="Name to check in (and send as SNI to) every server instead of its host.",
        ),
        click.option(
            "--tls-cert",
            "tls_cert_path",
            default=None,
            metavar="PEM",
            help="Client certificate, for servers that require one (mutual TLS).",
        ),
        click.option(
            "--tls-key",
            "tls_key_path",
            default=None,
            metavar="PEM",
            help="Its private key (default: in --tls-cert).",
        ),
        click.option(
            "--tls-key-password",
            "tls_key_password",
            default=None,
            metavar="TEXT",
            help="The key's pass phrase (prefer TRIMQ_TLS_KEY_PASSWORD: a flag shows in `ps`).",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


# Parameter name -> the option as written (for errors).
_TLS_FLAGS = {
    "use_tls": "--tls",
    "tls_trust_cert_path": "--tls-trust-cert",
    "tls_verify_server": "--tls-[no-]verify-server",
    "tls_check_hostname": "--tls-[no-]check-hostname",
    "tls_server_hostname": "--tls-server-name",
    "tls_cert_path": "--tls-cert",
    "tls_key_path": "--tls-key",
    "tls_key_password": "--tls-key-password",
}


def tls(values: dict[str, Any]) -> dict[str, Any]:
    """The `ClientConfig` options of the `tls_options` given (`values`: the command's
    parameters; those not given are left to the config's defaults).

    Raises:
        click.UsageError: TLS options without TLS (no --tls, TRIMQ_USE_TLS unset).
    """
    given = {k: values[k] for k in _TLS_FLAGS if values.get(k) is not None}
    use_tls = given.get("use_tls")
    if use_tls is None:
        env = os.environ.get(USE_TLS_ENV, "").strip().lower()
        use_tls = env in ("1", "true", "yes", "on")
    others = [_TLS_FLAGS[k] for k in _TLS_FLAGS if k in given and k != "use_tls"]
    if others and not use_tls:
        raise click.UsageError(f"{', '.join(others)}: only with --tls (or {USE_TLS_ENV}=true)")
    return given


def client_config(**options: Any) -> ClientConfig:
    """`ClientConfig(**options)`, its validation errors (an option, or a TRIMQ_* variable it
    defaults from, such as TRIMQ_USE_TLS=maybe) as one usage error. Values are left out of
    the message: they may be secrets.

    Raises:
        click.UsageError: the options do not validate.
    """
    try:
        return ClientConfig(**options)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'options'}: {err['msg']}"
            for err in exc.errors(include_input=False, include_url=False)
        )
        raise click.UsageError(f"bad client options ({problems})") from None
