"""A local server out of file descriptors, for real: a process under a low RLIMIT_NOFILE."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
import textwrap

import aiohttp

from ..child_signals import send_signal

# The server in a process of its own, with 48 descriptors: fewer than the connections the test
# opens, far fewer than its connection cap (256), so accept() itself meets EMFILE.
SERVER = textwrap.dedent(
    """
    import asyncio, resource, sys
    from aiohttp import web
    from kiosk_agent.web.server import HttpLimits, LocalSite

    resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))

    async def main():
        site = LocalSite("127.0.0.1", 0, name="test",
                         limits=HttpLimits.from_config({"header_timeout": 60}))
        async def stats(request):
            return web.json_response({"accept_pauses": site.accept_pauses,
                                      "open": site.open_connections})
        app = web.Application()
        app.router.add_get("/stats", stats)
        await site.start(app)
        print(site.port, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


async def test_out_of_descriptors_the_server_pauses_accepting_then_serves_again() -> None:
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SERVER,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    assert server.stdout is not None
    held: list[socket.socket] = []
    try:
        port = int(await asyncio.wait_for(server.stdout.readline(), 30))
        for _ in range(80):  # silent newcomers: each one the server accepts holds a descriptor
            sock = socket.create_connection(("127.0.0.1", port))
            held.append(sock)
        await asyncio.sleep(0.5)  # the server accepts what it can, then meets EMFILE
        for sock in held:
            sock.close()
        held.clear()
        figures = await _stats_within(port, 15)
        assert figures["accept_pauses"] >= 1, figures  # it paused instead of spinning or dying
        assert server.returncode is None  # and it is still running
    finally:
        for sock in held:
            sock.close()
        send_signal(server, signal.SIGKILL)
        _, stderr = await server.communicate()
    assert b"Traceback" not in stderr, stderr.decode()[-2000:]
    # its start said its caps do not fit the limit it was given (read without `resource`)
    assert b"descriptors but the limit is 48" in stderr, stderr.decode()[-2000:]


async def _stats_within(port: int, seconds: float) -> dict[str, int]:
    """The server's /stats, asked again until it answers (its paused accept, its cleanup)."""
    async with asyncio.timeout(seconds), aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(f"http://127.0.0.1:{port}/stats") as response:
                    figures: dict[str, int] = json.loads(await response.text())
                    return figures
            except aiohttp.ClientError:
                await asyncio.sleep(0.2)
