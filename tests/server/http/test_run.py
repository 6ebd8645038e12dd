"""The listening socket `serve` binds: the connections asyncio accepts on it send small writes at once."""

from __future__ import annotations

import asyncio
import socket

from ollama_spec.server.http.run import bind


def test_accepted_connections_have_tcp_nodelay():
    """Without it each small answer (a stream's pieces, /api/version) waits ~40 ms for Nagle's algorithm
    and the client's delayed ACK: asyncio sets TCP_NODELAY only where the socket names IPPROTO_TCP."""

    async def accepted_nodelay() -> int:
        found: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def connected(reader, writer) -> None:
            sock = writer.get_extra_info("socket")
            found.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        listening = bind("127.0.0.1", 0)
        server = await asyncio.start_server(connected, sock=listening)
        async with server:
            _, writer = await asyncio.open_connection(*listening.getsockname()[:2])
            value = await asyncio.wait_for(found, 10)
            writer.close()
        return value

    assert asyncio.run(accepted_nodelay()) != 0
