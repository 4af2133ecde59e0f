"""TCP relay: `trimq-relay LISTEN=TARGET[,LISTEN=TARGET...]`, each HOST:PORT.

A broker's container runs it (deploy/entrypoint.sh, PEER_RELAY) so that the remoting address of
the other broker of its group as the NameServer lists it (127.0.0.1:<port>, the address clients
on the host use) reaches that broker by service name inside the compose network: a slave copies
its master's metadata from there, a starting master asks its slave for what it lacks. Each
accepted connection gets its own connection to the target (resolved anew, so a peer that comes
back with a new container address is found); either side closing closes both.

Standalone on purpose (stdlib only): it runs next to the broker in the same image.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

CONNECT_TIMEOUT_S = 5.0
CHUNK = 64 * 1024


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host, int(port)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(listen: tuple[str, int], target: tuple[str, int]) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(*target), CONNECT_TIMEOUT_S
            )
        except (TimeoutError, OSError):
            writer.close()
            return
        # Both directions end when either side closes (each pipe closes its writer).
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, *listen, reuse_address=True)
    async with server:
        await server.serve_forever()


async def main(spec: str) -> None:
    pairs = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        listen, sep, target = item.partition("=")
        if not sep:
            raise ValueError(f"{item!r} is not LISTEN=TARGET")
        pairs.append((_host_port(listen), _host_port(target)))
    if not pairs:
        raise ValueError("nothing to relay")
    await asyncio.gather(*(_serve(listen, target) for listen, target in pairs))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__.splitlines()[0], file=sys.stderr)
        sys.exit(2)
    try:
        asyncio.run(main(sys.argv[1]))
    except ValueError as exc:
        print(f"trimq-relay: {exc}", file=sys.stderr)
        sys.exit(2)
