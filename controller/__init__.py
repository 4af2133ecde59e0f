"""RocketMQ 5.x controller mode: automatic master failover per broker group.

The controller's state and its leadership live in etcd (`controller.etcd`, the client;
`controller.election`, leader election on a lease); the rules for one broker group are pure
functions (`controller.replicas`). Design: docs/controller.md.
"""
