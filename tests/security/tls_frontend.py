"""A TLS terminator in front of the plaintext dev server, run as its own process by the transport tests.

``python -m tests.security.tls_frontend CERT KEY CLIENT_CA|- UPSTREAM`` serves TLS (HTTP/2 by ALPN) on
a free loopback port, prints the port on stdout, and pipes each connection to ``UPSTREAM``
(``host:port``); with a client CA it requires a client certificate signed by it (mTLS).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def serve(cert: str, key: str, client_ca: str | None, upstream: str) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])
    if client_ca:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
    host, port = upstream.rsplit(":", 1)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    cert, key, client_ca, upstream = sys.argv[1:5]
    asyncio.run(serve(cert, key, None if client_ca == "-" else client_ca, upstream))
