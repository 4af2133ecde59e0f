"""common.config: defaults < TOML < TRIMQ_* environment < flags into any pydantic model, and the
broker's and NameServer's loaders built on it (their messages unchanged)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, field_validator

from common.config import ConfigError, env_overrides, load_settings

pytestmark = pytest.mark.unit


class Toy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "default"
    size: int = 1
    on: bool = False

    @field_validator("size")
    @classmethod
    def _small(cls, v: int) -> int:
        if v > 100:
            raise ValueError("too big")
        return v


def _load(
    config_file: Path | str | None = None,
    *,
    environ: dict[str, str] | None = None,
    flags: dict[str, object] | None = None,
    error_source: Literal["layers", "file"] = "layers",
) -> Toy:
    return load_settings(
        Toy,
        "toy",
        config_file,
        flags=flags,
        environ={} if environ is None else environ,
        error_source=error_source,
    )


def test_defaults() -> None:
    cfg = _load()
    assert cfg == Toy()
    assert type(cfg) is Toy


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    f = tmp_path / "toy.toml"
    f.write_text('name = "file"\nsize = 2\non = true\n')
    assert _load(f) == Toy(name="file", size=2, on=True)
    env = {"TRIMQ_NAME": "env", "TRIMQ_SIZE": "3"}
    assert _load(f, environ=env) == Toy(name="env", size=3, on=True)
    cfg = _load(f, environ=env, flags={"name": "flag", "size": None})
    assert cfg == Toy(name="flag", size=3, on=True)


def test_program_table_overrides_top_level(tmp_path: Path) -> None:
    f = tmp_path / "toy.toml"
    f.write_text('name = "top"\nsize = 5\n[toy]\nname = "table"\n')
    assert _load(f) == Toy(name="table", size=5)
    other = tmp_path / "other.toml"
    other.write_text('[other]\nname = "x"\n')
    with pytest.raises(ConfigError, match=r"other: unknown setting"):
        _load(other)


def test_env_names_only_fields_with_the_exact_prefix() -> None:
    environ = {
        "TRIMQ_NAME": "a",
        "TRIMQ_BROKER_NAME": "someone else's",
        "trimq_size": "7",
        "TRIMQSIZE": "7",
        "NAME": "b",
    }
    assert env_overrides(Toy, environ) == {"name": "a"}


def test_os_environ_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIMQ_SIZE", "9")
    assert load_settings(Toy, "toy").size == 9


def test_file_errors(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError) as info:
        _load(missing)
    assert str(info.value) == f"cannot read config file {missing}: No such file or directory"
    assert isinstance(info.value.__cause__, OSError)
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [\n")
    with pytest.raises(ConfigError, match=r"^config file .*bad\.toml is not valid TOML: "):
        _load(bad)


def test_every_bad_setting_is_named(tmp_path: Path) -> None:
    f = tmp_path / "t.toml"
    f.write_text("bogus = 1\nsize = 500\n")
    with pytest.raises(ConfigError) as info:
        _load(f)
    assert str(info.value) == (
        f"invalid toy configuration (defaults, {f}): size: Value error, too big; "
        "bogus: unknown setting"
    )
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


@pytest.mark.parametrize(
    ("use_file", "environ", "flags", "error_source", "expected"),
    [
        (False, {"TRIMQ_SIZE": "500"}, None, "layers", "defaults, environment"),
        (False, {}, {"size": 500}, "layers", "defaults, flags"),
        (True, {}, {"size": 500, "name": None}, "layers", "defaults, FILE, flags"),
        (True, {"TRIMQ_SIZE": "500"}, {"on": True}, "layers", "defaults, FILE, environment, flags"),
        (False, {"TRIMQ_SIZE": "500"}, {"on": True}, "file", "defaults"),
        (True, {"TRIMQ_SIZE": "500"}, {"on": True}, "file", "FILE"),
    ],
)
def test_error_source_names_layers_or_the_file(
    tmp_path: Path,
    use_file: bool,
    environ: dict[str, str],
    flags: dict[str, object] | None,
    error_source: Literal["layers", "file"],
    expected: str,
) -> None:
    f = tmp_path / "t.toml"
    f.write_text('name = "x"\n')
    with pytest.raises(ConfigError) as info:
        _load(f if use_file else None, environ=environ, flags=flags, error_source=error_source)
    source = expected.replace("FILE", str(f))
    assert str(info.value) == f"invalid toy configuration ({source}): size: Value error, too big"


def test_broker_and_namesrv_keep_their_messages(tmp_path: Path) -> None:
    import broker.config
    import namesrv.config

    assert broker.config.ConfigError is ConfigError
    assert namesrv.config.ConfigError is ConfigError
    env = {"TRIMQ_LOG_LEVEL": "loud"}
    level = "log_level: Input should be 'debug', 'info', 'warning' or 'error'"
    # The broker names the file (or "defaults") whatever layer the bad value came from.
    with pytest.raises(ConfigError) as info:
        broker.config.load_config(environ=env)
    assert str(info.value) == f"invalid broker configuration (defaults): {level}"
    f = tmp_path / "b.toml"
    f.write_text('[broker]\nbroker_name = "b"\n')
    with pytest.raises(ConfigError) as info:
        broker.config.load_config(f, environ=env)
    assert str(info.value) == f"invalid broker configuration ({f}): {level}"
    assert broker.config.load_config(f, environ={}).broker_name == "b"
    # The NameServer names every layer that gave values.
    with pytest.raises(ConfigError) as info:
        namesrv.config.load_config(environ=env, flags={"listen": "127.0.0.1:1"})
    assert str(info.value) == (
        f"invalid namesrv configuration (defaults, environment, flags): {level}"
    )
