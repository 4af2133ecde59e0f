"""trimq against its peers (NATS JetStream, Redis Streams) on one machine, in one run.

`python -m bench.peers [--quick]` (or `make bench`): see `bench/peers/run.py`.
"""
