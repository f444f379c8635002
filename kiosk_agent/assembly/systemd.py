"""systemd integration: sd_notify by hand, and a watchdog fed only while the loop is healthy.

The notify protocol is one datagram per message on the unix socket named by ``$NOTIFY_SOCKET``
(``@`` means the abstract namespace); a dependency for that would be larger than the code. With no
socket (not run by systemd, or in tests) every call is a no-op, so callers need no branches.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

from kiosk_agent.tasks import BackgroundTask

_LOGGER = logging.getLogger(__name__)

# What a stop takes beside the drain (sales.stop_timeout): parking what is still open, the
# platforms' and the HTTP servers' own stops (http.shutdown_grace, 5 s), closing the service
# and the journal. systemd/kiosk-agent.service's TimeoutStopSec is the default drain plus this.
STOP_MARGIN = 15.0


class SystemdNotifier:
    def __init__(self, address: str | None) -> None:
        self._address = _socket_address(address) if address else None
        self._socket: socket.socket | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SystemdNotifier:
        env = os.environ if environ is None else environ
        return cls(env.get("NOTIFY_SOCKET"))

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, *fields: str) -> bool:
        """Send ``KEY=value`` fields in one datagram; False when there is nowhere to send."""
        if self._address is None:
            return False
        if self._socket is None:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._socket.setblocking(False)
        try:
            self._socket.sendto("\n".join(fields).encode(), self._address)
        except OSError as err:
            # systemd gone or the socket full: losing one notification must not stop the agent.
            _LOGGER.warning("sd_notify failed: %s", err)
            return False
        return True

    def ready(self, status: str = "") -> bool:
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def stopping(self, status: str = "", *, extend: float | None = None) -> bool:
        """STOPPING=1; ``extend``: seconds more the stop may take from now (a drain configured
        longer than the unit's TimeoutStopSec is not cut short by systemd)."""
        fields = ["STOPPING=1"]
        if status:
            fields.append(f"STATUS={' '.join(status.split())}")
        if extend is not None:
            fields.append(f"EXTEND_TIMEOUT_USEC={int(extend * 1_000_000)}")
        return self.notify(*fields)

    def status(self, text: str) -> bool:
        # One line: systemd shows STATUS= verbatim and a newline would start a new field.
        return self.notify(f"STATUS={' '.join(text.split())}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _socket_address(path: str) -> str:
    return "\0" + path[1:] if path.startswith("@") else path


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Half of ``WatchdogSec`` (as systemd recommends), or None when no watchdog is asked for."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        _LOGGER.warning("ignoring WATCHDOG_USEC=%r: not an integer", usec)
        return None
    return value / 2_000_000 if value > 0 else None


class Watchdog:
    """Pets the systemd watchdog each `interval` while the event loop and the agent are well.

    A blocked loop cannot run this task at all, so systemd restarts the unit; a loop that runs but
    lags by more than `max_lag`, or an agent whose `is_healthy()` says no, stops feeding on purpose.
    """

    def __init__(
        self,
        notifier: SystemdNotifier,
        interval: float,
        *,
        max_lag: float | None = None,
        is_healthy: Callable[[], bool] = lambda: True,
        status_text: Callable[[], str] | None = None,
    ) -> None:
        self._notifier = notifier
        self._status_text = status_text
        self._last_status = ""
        self._interval = interval
        self._max_lag = max_lag if max_lag is not None else interval
        self._is_healthy = is_healthy
        self._loop = BackgroundTask(self._run, "systemd-watchdog")
        self.fed = 0
        self.withheld = 0
        self.last_lag = 0.0

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def _run(self) -> None:
        while True:
            self.beat(await self._measure_lag())

    async def _measure_lag(self) -> float:
        start = time.monotonic()
        await asyncio.sleep(self._interval)
        return max(0.0, time.monotonic() - start - self._interval)

    def beat(self, lag: float) -> bool:
        """Feed the watchdog if `lag` is acceptable and the agent says it is healthy."""
        self.last_lag = lag
        self._update_status()
        reason = ""
        if lag > self._max_lag:
            reason = f"event loop lag {lag:.3f} s"
        else:
            try:
                healthy = self._is_healthy()
            except Exception:
                _LOGGER.exception("watchdog health check raised")
                healthy = False
            if not healthy:
                reason = "agent reports itself unhealthy"
        if reason:
            self.withheld += 1
            _LOGGER.warning("not feeding the systemd watchdog: %s", reason)
            return False
        self.fed += 1
        self._notifier.watchdog()
        return True

    def _update_status(self) -> None:
        """Refresh the line `systemctl status` shows, when it changed."""
        if self._status_text is None:
            return
        try:
            text = self._status_text()
        except Exception:
            _LOGGER.exception("status text failed")
            return
        if text != self._last_status:
            self._last_status = text
            self._notifier.status(text)


class SystemdLifecycle:
    """READY on start (with the watchdog if systemd asked for one), STOPPING on stop."""

    def __init__(
        self,
        notifier: SystemdNotifier | None = None,
        *,
        is_healthy: Callable[[], bool] = lambda: True,
        status_text: Callable[[], str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.notifier = notifier or SystemdNotifier.from_env(environ)
        self._said_stopping = False
        interval = watchdog_interval(environ)
        self.watchdog = (
            Watchdog(self.notifier, interval, is_healthy=is_healthy, status_text=status_text)
            if interval
            else None
        )

    async def start(self, status: str = "running", *, ready: bool = True) -> None:
        """Start feeding the watchdog; READY=1 now, or (``ready=False``) later with ``ready()``."""
        if ready:
            self.notifier.ready(status)
        else:
            self.notifier.status(status)
        if self.watchdog is not None:
            self.watchdog.start()

    def ready(self, status: str = "running") -> None:
        self.notifier.ready(status)

    def extend_start(self, seconds: float) -> None:
        """Ask systemd for more start time (TimeoutStartSec) while recovery runs."""
        self.notifier.notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")

    def stopping(self, status: str, seconds: float) -> None:
        """The drain begins: STOPPING=1 now, and the stop may take ``seconds`` (the drain) plus
        :data:`STOP_MARGIN` from now. The watchdog is still fed meanwhile."""
        self._said_stopping = True
        self.notifier.stopping(status, extend=seconds + STOP_MARGIN)

    async def stop(self) -> None:
        if not self._said_stopping:
            self.notifier.stopping()
        if self.watchdog is not None:
            await self.watchdog.stop()
        self.notifier.close()
