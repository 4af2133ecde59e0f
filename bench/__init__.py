"""Benchmarks (run as scripts, or `python -m bench.peers`)."""
