"""Shared pytest configuration: markers follow the directory a test lives in."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog
import trio

from tests.helpers import StagingGuard

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
        # Under pytest-xdist's `--dist loadgroup` (make test): a module's tests run in one
        # worker (its module fixtures start once), and the Spark tests all in one (one JVM
        # and one session cluster).
        if item.get_closest_marker("xdist_group") is None:
            group = "spark" if marker == "spark" else rel.as_posix()
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
async def staging_guard(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[StagingGuard]:
    """Every in-process store of the test keeps the staging rule (`tests.helpers.StagingGuard`);
    the test fails at teardown otherwise."""
    guard = StagingGuard()
    guard.watch(monkeypatch)
    trio.lowlevel.add_instrument(guard)
    try:
        yield guard
    finally:
        trio.lowlevel.remove_instrument(guard)
    assert guard.violations == [], guard.violations[:5]


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    """A test that runs a CLI configures structlog for the whole process (its level filter,
    logger caching): later tests get the configuration back as it was, so a test that
    captures log events sees them whatever ran before it."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
