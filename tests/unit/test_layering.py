"""The layering rules of docs/architecture.md, checked by walking every module's imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = {"common", "remoting", "store", "namesrv", "broker", "client", "controller", "dashboard"}

# package -> packages of ours it may import
ALLOWED: dict[str, set[str]] = {
    "common": set(),
    "remoting": {"common"},
    "store": {"common"},
    "namesrv": {"common", "remoting"},
    "broker": {"common", "remoting", "store"},
    "client": {"common", "remoting"},
    # The controller keeps its state in etcd; it never reaches into brokers or stores.
    "controller": {"common", "remoting"},
    # The dashboard is a client of the cluster: the admin client, never a server's internals.
    "dashboard": {"common", "remoting", "client"},
}
THIRD_PARTY: dict[str, set[str]] = {
    "common": {"trio", "pydantic", "structlog", "yaml"},
    "remoting": {"trio", "msgpack", "structlog"},
    "store": {"trio", "pydantic", "structlog"},
    "controller": {"trio", "httpx", "pydantic", "structlog", "click"},
}


def _imports(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.extend(
                (f"{node.module}.{alias.name}" if alias.name != "*" else node.module, node.lineno)
                for alias in node.names
            )
    return found


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(OURS))
def test_package_imports_respect_layers(package: str) -> None:
    import sys

    stdlib = set(sys.stdlib_module_names)
    problems: list[str] = []
    for path in _modules(package):
        rel = path.relative_to(ROOT)
        for name, line in _imports(path):
            top = name.split(".")[0]
            if top == package or top == "__future__":
                continue
            if top in OURS:
                if top not in ALLOWED[package]:
                    problems.append(f"{rel}:{line} imports {name}")
                    continue
                parts = name.split(".")
                # Cross-package imports use public modules and names only (but the command
                # line tools' shared options, which mqdashboard takes as mqadmin does).
                shared_options = package == "dashboard" and name.startswith("client.cli._options.")
                if not shared_options and any(
                    p.startswith("_") and p != "__init__" for p in parts[1:]
                ):
                    problems.append(f"{rel}:{line} imports private {name}")
            elif package in THIRD_PARTY and top not in stdlib and top not in THIRD_PARTY[package]:
                problems.append(f"{rel}:{line} imports third-party {top}")
            if top == "pydantic" and package == "store" and path.name != "config.py":
                problems.append(f"{rel}:{line}: pydantic only in store/config.py")
    assert problems == []


def test_layering_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "m.py"
    bad.write_text("import broker\nfrom store._x import y\n")
    assert [n for n, _ in _imports(bad)] == ["broker", "store._x.y"]
