"""Code shared by every trimq package: RocketMQ's `common` module, below client, broker,
store, remoting and namesrv, and importing none of them.

What lives here is what more than one package needs and what has one right answer: hashes
that must match Java's, tag expressions, delay levels, pull flags, config loading, a trio loop
hosted in a thread. Its contracts: docs/internal-apis.md ("common").
"""
