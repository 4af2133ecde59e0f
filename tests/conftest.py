"""Shared pytest configuration: markers follow the directory a test lives in."""

from __future__ import annotations

from pathlib import Path

import pytest

_MARKER_BY_DIR = {
    "unit": "unit",
    "integration": "integration",
    "compat": "compat",
    "cluster": "cluster",
    "spark": "spark",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        try:
            rel = Path(str(item.fspath)).relative_to(root)
        except ValueError:
            continue
        marker = _MARKER_BY_DIR.get(rel.parts[0]) if rel.parts else None
        if marker is not None:
            item.add_marker(getattr(pytest.mark, marker))
