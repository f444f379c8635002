"""What the fleet tests share: a settled agent, a TCP proxy that plays the network, an HTTP
receiver, throwaway TLS certificates."""

import asyncio
import contextlib
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from aiohttp import web

from kiosk_agent.health.model import Health
from kiosk_agent.web.server import LocalSite

from ..helpers import free_port


def make_certificates(directory: Path) -> Path:
    """A throwaway CA and a server certificate for 127.0.0.1 (openssl CLI); returns the CA."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=kiosk-agent test CA",
    )
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "1",
        "-extfile",
        "san.ext",
    )
    return directory / "ca.crt"


def tls_listener(directory: Path) -> tuple[Path, str]:
    """Throwaway certificates in ``directory`` and Mosquitto's listener lines that serve them:
    (the CA a client verifies with, the lines for ``start_broker``)."""
    ca = make_certificates(directory)
    key, cert = directory / "server.key", directory / "server.crt"
    return ca, f"cafile {ca}\ncertfile {cert}\nkeyfile {key}\n"


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target; `cut()` aborts every connection and refuses more."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.answer_delay = 0.0  # seconds each chunk from the target waits: a slow broker

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers.update({writer, up_writer})

        async def pipe(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, answers: bool = False
        ) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    if answers and self.answer_delay:
                        await asyncio.sleep(self.answer_delay)
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer, answers=True))


def settled_agent(version: str = "9.9.9") -> SimpleNamespace:
    """An agent that has settled: the service and its terminal checked."""
    health = Health(version)
    health.report_service(True)
    health.report_terminal("SIM-0001", online=True, connected=True, latency_ms=8.0, pinged=True)
    return SimpleNamespace(health=health)


class Recovering:
    """The agent's recovery while it finishes the sales a crash left open."""

    state = "running"


class HttpReceiver:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.bodies: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.port = free_port()  # fixed: the receiver goes down and comes back on it
        self._site = LocalSite(host, self.port)
        self.failing = False  # answer 503, as an overloaded fleet server would
        self.redirect_to: str | None = None  # answer 307 to there

    async def _post(self, request: web.Request) -> web.Response:
        if self.failing:
            return web.json_response({"error": "overloaded"}, status=503)
        if self.redirect_to is not None:
            raise web.HTTPTemporaryRedirect(self.redirect_to)
        self.bodies.append(await request.json())
        self.auth.append(request.headers.get("Authorization"))
        return web.json_response({"ok": True})

    async def up(self) -> None:
        app = web.Application()
        app.router.add_post("/heartbeat", self._post)
        await self._site.start(app)

    async def down(self) -> None:
        await self._site.stop()
