"""A real Mosquitto broker for the MQTT tests, and a client that records what it hands out.

Import the ``mosquitto`` fixture into a test module to use it (``./dev test`` installs Mosquitto).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import pytest

from .helpers import free_port


def start_broker(
    directory: Path, extra: str = "", *, port: int | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """A broker on ``port`` (default: a free one; give the old one to restart a broker)."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(binary).exists():
        pytest.fail("mosquitto is not installed (./dev test installs it)")
    port = port or free_port()
    conf = directory / "mosquitto.conf"
    # `user`: when run as root, mosquitto would switch to its own user and lose our temp files
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        f"user {getpass.getuser()}\n{extra}"
    )
    proc = subprocess.Popen(
        [binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("mosquitto did not start")
            time.sleep(0.05)


def stop_broker(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(5)


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A real Mosquitto broker on an ephemeral loopback port for the whole run."""
    proc, port = start_broker(tmp_path_factory.mktemp("mosquitto"))
    yield port
    stop_broker(proc)


class Observer:
    """A second MQTT client that records what the broker hands out."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.messages: list[tuple[str, str, bool]] = []
        self._task: asyncio.Task[None] | None = None
        self._client: aiomqtt.Client | None = None
        self.subscribed = asyncio.Event()
        # a topic of this observer's own: what it publishes there comes back behind everything
        # the broker had queued for it (one client's messages keep their order)
        self._marker = f"test-observer/{uuid.uuid4().hex}"
        self._markers_heard = 0
        self._heard = asyncio.Condition()

    async def start(self, *topics: str) -> None:
        self._task = asyncio.create_task(self._run(topics))
        await asyncio.wait_for(self.subscribed.wait(), 5)

    async def _run(self, topics: tuple[str, ...]) -> None:
        async with aiomqtt.Client("127.0.0.1", self.port) as client:
            for topic in (*topics, self._marker):
                await client.subscribe(topic, qos=1)
            self._client = client
            self.subscribed.set()
            async for message in client.messages:
                if str(message.topic) == self._marker:
                    async with self._heard:
                        self._markers_heard += 1
                        self._heard.notify_all()
                    continue
                payload = message.payload
                text = payload.decode() if isinstance(payload, bytes) else str(payload)
                self.messages.append((str(message.topic), text, message.retain))

    async def caught_up(self, within: float = 30.0) -> None:
        """Everything the broker had for this observer when called is in ``messages`` (the
        retained ones a subscription is handed, too): no fixed wait that a busy machine
        outlasts."""
        assert self._client is not None, "start() first"
        async with self._heard:
            wanted = self._markers_heard + 1
        await self._client.publish(self._marker, b"", qos=1)
        async with asyncio.timeout(within), self._heard:
            await self._heard.wait_for(lambda: self._markers_heard >= wanted)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def on(self, topic: str) -> list[str]:
        return [payload for t, payload, _ in self.messages if t == topic]
