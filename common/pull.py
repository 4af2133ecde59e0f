"""Pull request sys flags: the bits of PULL_MESSAGE's `sysFlag` header (RocketMQ's PullSysFlag).

Plain ints, not an IntFlag: the broker tests them on every pull, and `hdr.sys_flag & FLAG` on
ints costs no enum machinery.
"""

from __future__ import annotations

__all__ = [
    "PULL_FLAG_CLASS_FILTER",
    "PULL_FLAG_COMMIT_OFFSET",
    "PULL_FLAG_LITE_PULL",
    "PULL_FLAG_SUBSCRIPTION",
    "PULL_FLAG_SUSPEND",
]

PULL_FLAG_COMMIT_OFFSET = 0x1
"""The request carries the group's consumed offset (commitOffset) for the broker to store."""
PULL_FLAG_SUSPEND = 0x2
"""Nothing to return: hold the pull until a message arrives or suspendTimeoutMillis passes."""
PULL_FLAG_SUBSCRIPTION = 0x4
"""The request carries its subscription expression (and expressionType); else the broker uses
the group's registered subscription."""
PULL_FLAG_CLASS_FILTER = 0x8
"""Class filter mode (RocketMQ's deprecated filter server); trimq's broker ignores it."""
PULL_FLAG_LITE_PULL = 0x10
"""Set by a lite pull consumer (RocketMQ's FLAG_LITE_PULL_MESSAGE); trimq's broker ignores it."""
