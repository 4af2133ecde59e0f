"""common.pull: PULL_MESSAGE's sys flag bits, defined once for broker and client."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import common.pull
from common.pull import (
    PULL_FLAG_CLASS_FILTER,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_LITE_PULL,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
FLAGS = {
    "PULL_FLAG_COMMIT_OFFSET": PULL_FLAG_COMMIT_OFFSET,
    "PULL_FLAG_SUSPEND": PULL_FLAG_SUSPEND,
    "PULL_FLAG_SUBSCRIPTION": PULL_FLAG_SUBSCRIPTION,
    "PULL_FLAG_CLASS_FILTER": PULL_FLAG_CLASS_FILTER,
    "PULL_FLAG_LITE_PULL": PULL_FLAG_LITE_PULL,
}


def test_values_are_rocketmqs_pull_sys_flag() -> None:
    # PullSysFlag: FLAG_COMMIT_OFFSET = 1 << 0 ... FLAG_LITE_PULL_MESSAGE = 1 << 4.
    assert list(FLAGS.values()) == [0x1, 0x2, 0x4, 0x8, 0x10]
    assert sorted(common.pull.__all__) == sorted(FLAGS)


def test_flags_are_plain_ints() -> None:
    # The broker tests them on every pull: no enum on that path.
    assert all(type(v) is int for v in FLAGS.values())


def test_no_package_defines_its_own_pull_flags() -> None:
    names = set(FLAGS) | {n.removeprefix("PULL_") for n in FLAGS} | {"FLAG_LITE_PULL_MESSAGE"}
    found: list[str] = []
    for package in ("common", "remoting", "store", "namesrv", "broker", "client"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "common" / "pull.py":
                continue
            found.extend(
                f"{path.relative_to(ROOT)}:{line} {name}"
                for name, line in _assigned_names(path.read_text(encoding="utf-8"))
                if name in names
            )
    assert found == []


def test_the_scan_sees_a_copy() -> None:
    assert _assigned_names("FLAG_SUSPEND = 0x2\nx: int = 1\n") == [
        ("FLAG_SUSPEND", 1),
        ("x", 2),
    ]


def _assigned_names(source: str) -> list[tuple[str, int]]:
    """(name, line) of every plain name assigned at any depth of `source`."""
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        out.extend((t.id, t.lineno) for t in targets if isinstance(t, ast.Name))
    return out
