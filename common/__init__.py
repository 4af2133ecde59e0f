"""Code shared by every trimq package: RocketMQ's `common` module, below client, broker,
store, remoting and namesrv, and importing none of them.

What lives here is what more than one package needs and what has one right answer: the
record codec, properties, message ids and UNIQ_KEYs (`common.message`, natively
`common.speedups`), hashes that must match Java's, tag expressions, delay levels, pull flags,
config loading, a trio loop hosted in a thread. Its contracts: docs/internal-apis.md ("common").
"""
