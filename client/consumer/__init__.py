"""Consumers: push and lite pull, with their rebalance, process queues and offset stores."""
