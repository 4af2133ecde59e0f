"""Typed RocketMQ header and body schemas: data only, no I/O."""
