"""A RemotingServer in its own process, for tests that kill it.

Run as `python -m tests.integration.remoting_server_proc [--port N]`; prints the bound port on
stdout, then serves until killed. Code 1 echoes the request (ext fields and body); code 2 never
answers (it keeps a request pending until the process dies).
"""

from __future__ import annotations

import argparse

import trio

from remoting import Connection, RemotingCommand, RemotingServer
from remoting.logs import configure_logging

ECHO = 1
HANG = 2


async def _echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.make_response(ext_fields=cmd.ext_fields, body=cmd.body)


async def _hang(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    await trio.sleep_forever()
    raise AssertionError("unreachable")


async def _main(port: int) -> None:
    server = RemotingServer(port=port)
    server.processors.register(ECHO, _echo)
    server.processors.register(HANG, _hang)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(server.run)
        print(bound, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    configure_logging("warning")
    trio.run(_main, args.port)


if __name__ == "__main__":
    main()
