"""Typed schemas of the RocketMQ protocol: custom headers (`headers`), route bodies (`route`)
and client/broker JSON bodies (`bodies`). Data only: no IO.

The header classes are re-exported here; import bodies from their modules
(`remoting.protocol.route`, `remoting.protocol.bodies`).
"""

# Every header class is re-exported; the list lives once, in `headers.__all__` (which also
# names a few codec helpers: those stay in `headers`).
from remoting.protocol import headers as _headers
from remoting.protocol.headers import *  # noqa: F403

__all__ = [name for name in _headers.__all__ if isinstance(getattr(_headers, name), type)]
