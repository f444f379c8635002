"""The one serial base every line-based platform stands on.

Modelled on zigpy's ``serial.py`` (a transport that waits for the port to really close, takes
``socket://host:port`` URLs, and is told when the link is lost) and aioesphomeapi's reconnect logic
(states, capped exponential backoff with jitter). A ``SerialLink`` owns one port for the life of a
platform: it opens it, splits what arrives into bounded lines, reconnects by itself when the
adapter vanishes (and finds it again under another name: configure a ``/dev/serial/by-id`` path or
a glob), restarts a link that falls silent, and reports every state change.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import fcntl
import functools
import logging
import random
import termios
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import field
from typing import Any

import serial
import serial_asyncio_fast

from kiosk_agent.data_class import data_class
from kiosk_agent.logs import RefusalLog
from kiosk_agent.platforms.serial_ports import BAUDRATE as BAUDRATE
from kiosk_agent.platforms.serial_ports import LINE_END as LINE_END
from kiosk_agent.platforms.serial_ports import RECONNECT_MAX as RECONNECT_MAX
from kiosk_agent.platforms.serial_ports import port_holder
from kiosk_agent.platforms.serial_ports import resolve_port as resolve_port
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.tasks import BackgroundTask, cancel_and_wait

_LOGGER = logging.getLogger(__name__)


class PortHeld(OSError):
    """The device node is locked by another process (another agent on the same reader)."""


class HeldSerial(serial.Serial):  # type: ignore[misc]  # pyserial has no types
    """A serial port this process keeps to itself while it is open.

    pyserial's ``exclusive`` (``flock``, before anything is set on the port) keeps a second
    agent out and lets it name the holder (``/proc/locks``); but ``flock`` is advisory: a
    terminal program (``screen``, ``minicom``, ``cat``) opens the port without it and can write
    into the live session. ``TIOCEXCL``, set as soon as pyserial's open returns, makes the
    kernel refuse every further open of the tty with EBUSY ("Device or resource busy"), except
    by a process with CAP_SYS_ADMIN (root): descriptors opened before it stay open. It is
    cleared (``TIOCNXCL``) just before the close, in the same thread and on the same
    descriptor: a tty whose other side stays (a pty) keeps the flag past a close otherwise.
    zigpy's serial base and pyserial give ``flock`` alone; this is both."""

    held = False  # TIOCEXCL set: further opens are refused (a tty; not a FIFO or a file)

    def open(self) -> None:
        super().open()
        try:
            fcntl.ioctl(self.fd, termios.TIOCEXCL)
        except OSError as err:  # not a tty (ENOTTY): the flock alone keeps agents out
            _LOGGER.warning("%s: other programs cannot be kept out of it (%s)", self.port,
                            err.strerror or err)
        else:
            self.held = True

    def close(self) -> None:
        if self.held and self.fd is not None:
            with contextlib.suppress(OSError):  # a device unplugged: nothing left to clear
                fcntl.ioctl(self.fd, termios.TIOCNXCL)
            self.held = False
        super().close()


class LinkState(enum.StrEnum):
    CONNECTING = "connecting"
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"  # lost or not found; a reconnect is scheduled
    CLOSED = "closed"  # stopped on purpose




@data_class(slots=True)
class SerialSettings:
    port: str  # a path, a glob (/dev/ttyUSB*), a by-id symlink, or socket://host:port
    baudrate: int = BAUDRATE
    max_line: int = 512  # longer runs without a line end are garbage and are dropped
    reconnect_min: float = 0.05  # first retry delay, seconds
    reconnect_max: float = RECONNECT_MAX  # backoff cap, seconds
    appear_poll: float = 0.25  # a missing device node is looked for this often, backoff or not
    # No byte for this long while connected: send the probe, then after as long again reconnect.
    silence_timeout: float | None = None
    probe: str | None = None  # a line the device always answers (keeps quiet links honest)
    line_end: str = LINE_END

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> SerialSettings:
        """From a serial platform's validated configuration; what it omits keeps the default."""
        tuning = ("baudrate", "line_end", "silence_timeout", "probe", "reconnect_max")
        return cls(port=config["port"], **{key: config[key] for key in tuning if key in config})


@data_class(slots=True)
class LinkStats:
    lines: int = 0
    dropped: int = 0  # garbage, overlong or undecodable input
    bytes_in: int = 0  # every byte read, lines or not (a peer can tell all it wrote was read)
    connects: int = 0
    reconnects: int = 0
    last_error: str = ""
    connected_at: float | None = None
    last_rx_at: float | None = None
    history: list[tuple[float, LinkState]] = field(default_factory=list)


LineHandler = Callable[[str], None]
StateHandler = Callable[[LinkState, str], None]
ConnectedHandler = Callable[[], Awaitable[None]]


def backoff_delay(attempt: int, minimum: float, maximum: float) -> float:
    """Capped exponential backoff with +-25% jitter, so a fleet does not retry in step."""
    base = min(maximum, minimum * (2 ** min(attempt, 30)))
    return float(max(minimum, min(maximum, base * random.uniform(0.75, 1.25))))


class _LineProtocol(asyncio.Protocol):
    """Bytes -> bounded, decoded lines. Never raises into the transport."""

    def __init__(self, link: SerialLink) -> None:
        self._link = link
        self._buffer = bytearray()
        self._discarding = False  # inside an overlong run: skip up to the next line end
        self.transport: asyncio.BaseTransport | None = None
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._link.stats.last_rx_at = self._link.now()
        self._link.stats.bytes_in += len(data)
        self._link.activity.set()
        self._buffer += data
        end = self._link.settings.line_end.encode()
        while True:
            index = self._buffer.find(end)
            if index < 0:
                break
            raw = bytes(self._buffer[:index])
            del self._buffer[: index + len(end)]
            if self._discarding:
                self._discarding = False
                continue
            self._link.handle_raw_line(raw)
        if len(self._buffer) > self._link.settings.max_line:
            self._link.drop(f"no line end within {self._link.settings.max_line} bytes")
            self._buffer.clear()
            self._discarding = True

    def connection_lost(self, exc: Exception | None) -> None:
        if self._buffer and not self._discarding:
            self._link.drop("partial line at disconnect")
        self._buffer.clear()
        if not self.lost.done():
            self.lost.set_result(exc)


class SerialLink:
    """One serial port, kept open: lines in, lines out, reconnect and watchdog built in."""

    def __init__(
        self,
        name: str,
        settings: SerialSettings,
        on_line: LineHandler,
        *,
        on_state: StateHandler | None = None,
        on_connected: ConnectedHandler | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.name = name
        self.settings = settings
        # The watchdog's silences and the probes' times run on it (monotonic seconds): the
        # machine's in the product, a test's FakeClock so a test moves time and a starved loop
        # cannot make an answer late. Reconnect backoff and closing the port stay real.
        self.clock = clock
        self.stats = LinkStats()
        self.noise = RefusalLog(_LOGGER, name)  # a device spewing garbage must not flood the log
        self.activity = asyncio.Event()
        self._on_line = on_line
        self._on_state = on_state
        self._on_connected = on_connected
        self._state = LinkState.CLOSED
        self._protocol: _LineProtocol | None = None
        self._loop = BackgroundTask(self._run, f"serial:{self.name}")
        self._connected = asyncio.Event()
        self._stopping = False
        self.port_in_use: str | None = None
        # the port open is kept from other programs (TIOCEXCL: HeldSerial): told in health
        self.held = False
        # Mid-exchange (a sale under way), silence is expected, and the device's answer to a
        # probe (its resting status) would be misread as the exchange's end: no probe then.
        self.busy: Callable[[], bool] = lambda: False
        # When the last probe went out (monotonic); the device clears it once it knows the answer.
        # A probe can cross a line the device sent meanwhile: its answer is older than that line.
        self.probe_sent_at: float | None = None

    # -- public ------------------------------------------------------------------------------

    @property
    def state(self) -> LinkState:
        return self._state

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def connected(self) -> bool:
        return self._state is LinkState.CONNECTED

    async def start(self) -> None:
        if self._loop.started:
            return
        self._stopping = False
        self._loop.start()

    async def stop(self) -> None:
        """Close the port and wait until it is really closed (so the next open finds it free)."""
        self._stopping = True
        await self._loop.stop()
        await self._close_transport()
        self._set_state(LinkState.CLOSED, "stopped")

    async def wait_connected(self) -> None:
        await self._connected.wait()

    def write_line(self, line: str) -> bool:
        """Send one line; False (and a log line) when the link is down: the caller decides."""
        protocol = self._protocol
        transport = protocol.transport if protocol is not None else None
        if not self.connected or transport is None or transport.is_closing():
            _LOGGER.warning("%s: not connected, cannot send %r", self.name, line)
            return False
        if not isinstance(transport, asyncio.WriteTransport):
            raise TypeError(f"transport: {type(transport).__name__}, not WriteTransport")
        transport.write((line + self.settings.line_end).encode("ascii", "replace"))
        return True

    def status(self) -> dict[str, Any]:
        return {
            "state": self._state.value,
            "port": self.settings.port,
            "port_in_use": self.port_in_use,
            "held": self.held and self.connected,
            "lines": self.stats.lines,
            "dropped": self.stats.dropped,
            "reconnects": self.stats.reconnects,
            "last_error": self.stats.last_error,
        }

    # -- called by the protocol ----------------------------------------------------------------

    def handle_raw_line(self, raw: bytes) -> None:
        raw = raw.rstrip(b"\r")
        if not raw:
            return
        if len(raw) > self.settings.max_line:
            self.drop(f"line of {len(raw)} bytes, longer than {self.settings.max_line}")
            return
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            self.drop(f"not ASCII: {raw[:40]!r}")
            return
        if not text.isprintable():
            self.drop(f"control characters: {raw[:40]!r}")
            return
        self.stats.lines += 1
        try:
            self._on_line(text)
        except Exception:
            # A handler bug must not take the link down; the line is lost, and said so.
            _LOGGER.exception("%s: handler failed on line %r", self.name, text)

    def drop(self, why: str) -> None:
        self.stats.dropped += 1
        self.noise("dropped_input", "%s: dropped input (%s)", self.name, why)

    # -- the reconnect loop --------------------------------------------------------------------

    async def _run(self) -> None:
        attempt = 0
        while not self._stopping:
            if attempt == 0:  # while retrying the state stays DISCONNECTED: one report per outage
                self._set_state(LinkState.CONNECTING, self.settings.port)
            try:
                await self._open()
            except (OSError, serial.SerialException, ValueError) as err:
                self.stats.last_error = str(err)
                delay = backoff_delay(
                    attempt, self.settings.reconnect_min, self.settings.reconnect_max
                )
                if self._port_missing(err) or isinstance(err, PortHeld):
                    # Looking for a device node costs nothing: keep looking often, so an adapter
                    # plugged back in is used at once whatever the backoff has grown to; so is
                    # a port another process holds, once it lets go.
                    delay = min(delay, self.settings.appear_poll)
                attempt += 1
                self._set_state(LinkState.DISCONNECTED, self._open_failed_words(err))
                await asyncio.sleep(delay)
                continue
            attempt = 0
            why = await self._serve()
            await self._close_transport()
            if self.stopping:
                return
            self.stats.reconnects += 1
            self._set_state(LinkState.DISCONNECTED, why)

    def _open_failed_words(self, err: BaseException) -> str:
        """What a tech reads on the link line when the port would not open. A device that is
        not there (the adapter unplugged, its cable or the adapter failed) is named by the path
        configured, with what to check, in place of pyserial's text (which says ``[Errno 2]``
        twice and nothing of a cable); any other failure keeps its own words."""
        port = self.settings.port
        if not self._port_missing(err):
            return f"cannot open {port}: {err}"
        what = str(err) if "no port matches" in str(err) else f"{port} is not there"
        return (
            f"adapter not found: {what} (unplugged, or its cable or adapter failed); check the "
            "USB cable and the adapter, `ls /dev/serial/by-id/` lists the adapters plugged in; "
            "the agent opens it again as soon as it appears"
        )

    def _port_missing(self, err: BaseException) -> bool:
        if "://" in self.settings.port:
            return False
        if isinstance(err, FileNotFoundError) or "no port matches" in str(err):
            return True
        return "No such file or directory" in str(err)  # pyserial wraps ENOENT in its own error

    async def _open(self) -> None:
        port = resolve_port(self.settings.port)
        if port is None:
            raise OSError(f"no port matches {self.settings.port}")
        loop = asyncio.get_running_loop()
        protocol = _LineProtocol(self)
        # A device node is taken with flock before anything is set or read on it (pyserial's
        # `exclusive`): a second agent on the reader (a tech's `kiosk-agent run` beside the
        # unit's, its own journal or a copy) would read bytes the first never hears, a vend
        # result among them, and write its own setup into the first one's session; then with
        # TIOCEXCL (HeldSerial), which refuses programs that take no flock (screen, minicom).
        self.held = False
        if "://" in port:
            await serial_asyncio_fast.create_serial_connection(
                loop, lambda: protocol, port, baudrate=self.settings.baudrate
            )
        else:
            opening = functools.partial(
                HeldSerial, port, baudrate=self.settings.baudrate, exclusive=True
            )
            try:
                device = await loop.run_in_executor(None, opening)
            except serial.SerialException as err:
                # EAGAIN: another's flock (an agent); EBUSY: another's TIOCEXCL (an agent under
                # another user, without CAP_SYS_ADMIN, is refused at the open, before its flock)
                if err.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EBUSY):
                    raise
                # "another process": none this process may see; a look through /proc/*/fd,
                # off the loop as the open is
                who = await loop.run_in_executor(None, port_holder, port)
                raise PortHeld(
                    f"held by {who if who == 'another process' else f'another process ({who})'}"
                    "; only one program may use a reader: stop that one first (looked at "
                    f"again every {self.settings.appear_poll:g} s)"
                ) from None
            await serial_asyncio_fast.connection_for_serial(loop, lambda: protocol, device)
            self.held = device.held
        self._protocol = protocol
        self.port_in_use = port
        self.stats.connects += 1
        self.stats.connected_at = self.now()
        self.stats.last_rx_at = self.now()

    async def _serve(self) -> str:
        """Stay connected until the link is lost or falls silent; return why it ended."""
        protocol = self._protocol
        if protocol is None:
            raise RuntimeError("the serial link has no protocol")
        # Let connection_made run before anything is written.
        await asyncio.sleep(0)
        port = self.port_in_use or self.settings.port
        # what a tech's `screen` on the port then meets, said where they look (health's link)
        self._set_state(LinkState.CONNECTED, f"{port}, held: other programs are refused it; "
                        "root is not" if self.held else port)
        if self._on_connected is not None:
            try:
                await self._on_connected()
            except Exception:
                _LOGGER.exception("%s: on_connected failed", self.name)
        watchdog = asyncio.create_task(self._watchdog())
        waiters: set[asyncio.Future[Any]] = {protocol.lost, watchdog}
        try:
            done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(watchdog)
        if protocol.lost in done:
            exc = protocol.lost.result()
            why = f"link lost: {exc}" if exc else "link closed by the device"
        else:
            why = watchdog.result() if not watchdog.cancelled() else "watchdog"
        self.stats.last_error = why
        return why

    async def _watchdog(self) -> str:
        timeout = self.settings.silence_timeout
        if timeout is None:
            await asyncio.Event().wait()  # no watchdog: wait for the link to be lost
            raise RuntimeError("the serial link's wait without a watchdog ended")
        probed = False
        while True:
            self.activity.clear()
            # a busy link sets activity all the time: a stop's cancellation must not be lost
            if await self._heard_within(timeout):
                probed = False
                continue
            if self.busy():
                probed = False  # quiet while the device waits on us: not a dead link
                continue
            if self.settings.probe and not probed:
                probed = True
                self.send_probe()
                continue
            return f"silent for {timeout * (2 if self.settings.probe else 1):.1f}s"

    async def _heard_within(self, seconds: float) -> bool:
        """Whether a byte came within ``seconds`` on the link's clock. The system clock's
        ``wait_for`` is ``asyncio.timeout``, as ``tasks.wait_event``: a cancel that lands as the
        event is set is passed on, not lost (``asyncio.wait_for`` on 3.11 loses it)."""
        with contextlib.suppress(TimeoutError):
            await self.clock.wait_for(self.activity.wait(), seconds)
        return self.activity.is_set()

    def now(self) -> float:
        """The link's clock (monotonic seconds): when its lines and probes come and go."""
        return self.clock.monotonic()

    def take_probe_answer(self, *, before: float, within: float) -> bool:
        """Whether the line just read answers a probe sent before ``before`` (``now()``), no
        more than ``within`` seconds ago. One probe, one answer: it is taken once."""
        sent = self.probe_sent_at
        if sent is None or before < sent:
            return False
        self.probe_sent_at = None
        return self.now() - sent <= within

    def send_probe(self) -> bool:
        """Ask the device for a sign of life: the probe line, which it always answers. Never
        mid-exchange (``busy``): the answer would be read as part of the exchange."""
        sent, heard = self.probe_sent_at, self.stats.last_rx_at
        in_flight = sent is not None and (heard is None or heard < sent)
        if not self.settings.probe or self.busy() or in_flight:
            return False  # one probe at a time: its answer is then the first line after it
        if not self.write_line(self.settings.probe):
            return False
        self.probe_sent_at = self.now()
        return True

    async def _close_transport(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is None:
            return
        transport = protocol.transport
        if transport is not None and not transport.is_closing():
            transport.close()
        if transport is not None:
            # pyserial-asyncio-fast closes the fd in an executor and only then calls
            # connection_lost: waiting for it is waiting for the port to be free again.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(protocol.lost), 5)

    def _set_state(self, state: LinkState, detail: str) -> None:
        changed = state is not self._state
        self._state = state
        if state is LinkState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
        if not changed:
            return
        self.stats.history.append((self.now(), state))
        del self.stats.history[:-50]
        log = _LOGGER.info if state in (LinkState.CONNECTED, LinkState.CLOSED) else _LOGGER.warning
        if state is LinkState.CONNECTING:
            log = _LOGGER.debug
        log("%s: serial link %s (%s)", self.name, state.value, detail)
        if self._on_state is not None:
            try:
                self._on_state(state, detail)
            except Exception:
                _LOGGER.exception("%s: state handler failed", self.name)
