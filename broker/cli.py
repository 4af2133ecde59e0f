"""`mqbroker` command line (not implemented yet)."""

from __future__ import annotations

import sys


def main() -> None:
    print("mqbroker: not implemented yet", file=sys.stderr)
    sys.exit(2)
