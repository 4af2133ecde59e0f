"""Request handlers of the broker, one module per family (send, pull, offsets, clients, admin).

Each module exposes a class built from the controller whose async methods are handlers
`(conn, cmd) -> RemotingCommand | None`; `BrokerController` registers them in one block.
"""
