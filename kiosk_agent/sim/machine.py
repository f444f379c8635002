"""A simulated vending machine: its controller behind a virtual MDB adapter, on a pseudo-terminal.

It speaks the adapter's text protocol (``mdb_protocol``) on the master side of a pty, so the agent's
``mdb`` platform talks to it exactly as to a USB adapter: through a real serial port. Or, with
``ControllerOptions(listen=("127.0.0.1", 0))``, on a TCP port the agent opens as
``socket://host:port`` (like ser2net): the machine then outlives any number of agent processes,
which is what ``kiosk-agent virtual`` and the crash tests use. ``VisitRecorder`` writes what the
machine really did (JSON lines) for a test to hold the agent's journal against. Customers are
scripted (``await controller.customer("A1", fail=True)``) or random, and the controller's quirks
are played on demand: a reset mid-session, repeated enables, a vend result that never comes,
garbage on the line, the adapter unplugged and plugged back (under another name).

It stands beside the payment simulator as the machine's fake: the ``virtual`` platform
(``platforms/virtual.py``) is a thin driver that gets it from the factory the CLI passes the agent
(:func:`make_machine`), so nothing below the CLI imports ``kiosk_agent.sim``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import math
import os
import random
import time
import tty
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from kiosk_agent.platforms import mdb_protocol as wire
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.sim.machine_books import MachineBooks, Payment, dex_port
from kiosk_agent.tasks import TaskSet

_LOGGER = logging.getLogger(__name__)

_ABORTED = -1  # what a pending answer resolves to when the session is torn down

Status = wire.ControllerStatus


class VisitOutcome(enum.StrEnum):
    VENDED = "vended"  # approved and dispensed
    FAILED = "failed"  # approved, the machine failed to dispense (c,ERR,VEND 3)
    NO_RESULT = "no_result"  # approved, the controller never reported the result (quirk)
    DENIED = "denied"  # the agent answered C,STOP
    WALKED_AWAY = "walked_away"  # the customer gave up before an answer
    ABORTED = "aborted"  # reset, disable or unplug mid-session


@dataclass(slots=True)
class Visit:
    """One customer at the machine, as the controller saw it."""

    number: int
    product: str | None
    price_cents: int
    outcome: VisitOutcome | None = None
    approved_cents: int | None = None
    funds_cents: int | None = None  # card first: what the session offered
    requested_at: float | None = None  # loop time the vend request went out
    answered_at: float | None = None  # loop time the agent's C,VEND / C,STOP came back


@dataclass(slots=True)
class _Pty:
    master: int
    slave: int
    name: str


@dataclass(slots=True)
class ControllerOptions:
    products: dict[str, int] = field(default_factory=lambda: {"A1": 150, "A2": 250, "B1": 325})
    unit: wire.AmountUnit = wire.AmountUnit.DOLLARS
    dispense_time: float = 0.02  # seconds the machine takes to drop the product
    enable_delay: float = 0.01  # controller poll latency after C,1 or a reset
    patience: float = 60.0  # how long a customer waits for approve/deny
    link_path: Path | None = None  # a by-id style symlink kept pointing at the current pty
    # (host, port): serve the adapter on TCP (socket://host:port) instead of a pty; port 0: any
    listen: tuple[str, int] | None = None
    # A quirk of some adapters: C,STATUS asked while a vend request waits is answered with that
    # request again (others answer their resting state, c,STATUS,ENABLED).
    status_repeats_vend: bool = False
    # Seconds the next customer needs to step up after one walked away. The agent's answer to
    # the one who left may still be on the wire; a real person is never quick enough to have it
    # taken for theirs (the adapter protocol has no session ids to tell the two apart).
    step_up_time: float = 0.2
    # a DEX port on a pty of its own (``controller.dex.port``) answering with the machine's books
    dex: bool = False


class Wire(Protocol):
    """Below the machine's protocol: where its bytes go (a pty, a TCP client, or a test's list)."""

    def write(self, data: bytes) -> None: ...


class VirtualController:
    """The machine: its controller and its adapter's line protocol over a transport.

    Layered as python-kasa's devices: the transport (a pty, a TCP port for ``socket://``, or
    :meth:`attach`'s in-memory wire) moves bytes; :meth:`feed` and :meth:`send` frame them into
    the adapter's lines (``mdb_protocol``); the rest is the controller. The fast tests attach a
    wire and play the agent's side with ``feed``: no pty, no socket."""

    def __init__(
        self, options: ControllerOptions | None = None, *, seed: int | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.options = options or ControllerOptions()
        # what the product's drop takes (``dispense_time``) is waited on it: a test's FakeClock
        # holds a product dropping for as long as the test needs (a link glitched mid-vend)
        self.clock = clock
        self.status = Status.INACTIVE
        self.visits: list[Visit] = []
        self.received: list[str] = []  # every line the agent sent, for tests and the live view
        # bytes written to the agent's pty: a test can tell the agent has read all of them
        # (its link's ``stats.bytes_in``), so no answer of the machine is still on its way
        self.written = 0
        self.unexpected: list[str] = []
        self._rng = random.Random(seed)
        self._pty: _Pty | None = None
        self._server: asyncio.Server | None = None  # listen mode: the adapter on TCP
        self._client: asyncio.Transport | None = None  # listen mode: the agent connected now
        self._wire: Wire | None = None  # attach(): an in-memory transport
        self._buffer = bytearray()
        self._answer: asyncio.Future[int | None] | None = None  # C,VEND amount, or None for no
        self._vend_request: str | None = None  # the vend request line while it waits
        self._session_funds: asyncio.Future[int | None] | None = None  # card first: C,START
        self._in_session = False
        self._walked_away_at = -math.inf  # loop time the last customer gave up waiting
        self._visit_lock = asyncio.Lock()
        # live views: called with (what happened, the visit) at each step of a visit
        self.observers: list[Callable[[str, Visit], None]] = []
        self._enabled = asyncio.Event()
        self._tasks = TaskSet()
        self._number = 0
        self.closing = asyncio.Event()  # set: the customer at the machine finishes, no new ones
        self._last_name: str | None = None
        self._epoch = 0  # bumped by every reset/unplug: a vend in flight across one is lost
        # the machine's own EVA-DTS counters: every product that drops, card or cash
        self.books = MachineBooks(self.options.products)
        # what each column holds (stock_columns): a column not named never runs out
        self.capacity: dict[str, int] = {}
        self.stock: dict[str, int] = {}
        self._before_refill: Callable[[], Awaitable[None]] | None = None
        self.dex = dex_port(self.books) if self.options.dex else None

    # -- the port --------------------------------------------------------------------------------

    @property
    def port(self) -> str:
        """Where the agent opens the adapter: the symlink if configured, else the pty itself (or
        ``socket://host:port`` in listen mode)."""
        if self._server is not None:
            host, port = self._server.sockets[0].getsockname()[:2]
            return f"socket://{host}:{port}"
        if self.options.link_path is not None:
            return str(self.options.link_path)
        if self._pty is None:
            raise RuntimeError("the controller is not started")
        return self._pty.name

    @property
    def connected(self) -> bool:
        """Listen mode: an agent has the adapter open now (a pty is always 'connected')."""
        if self._wire is not None:
            return True
        return self._client is not None if self.options.listen else self._pty is not None

    @property
    def pty_name(self) -> str | None:
        return self._pty.name if self._pty else None

    @property
    def plugged(self) -> bool:
        return self._pty is not None or self._server is not None or self._wire is not None

    def attach(self, wire: Wire) -> None:
        """Instead of :meth:`start`: the machine's bytes go to ``wire``; the agent's side is
        played through :meth:`feed`. The transport of the fast tests."""
        self._wire = wire
        self._buffer.clear()

    async def start(self) -> None:
        if self.dex is not None:
            await self.dex.start()
        if self.options.listen is not None:
            await self._listen(*self.options.listen)
        else:
            self.plug()

    async def stop(self) -> None:
        if self.dex is not None:
            await self.dex.stop()
        await self._tasks.cancel_all()
        if self._server is not None:
            server, self._server = self._server, None
            server.close()
            if self._client is not None:
                self._client.abort()
            await server.wait_closed()
        self.unplug()

    async def _listen(self, host: str, port: int) -> None:
        """Listen mode: one agent connection at a time; a newer one replaces the older.

        The agent going away (killed, restarted) is not a reset: the controller keeps its state
        and a customer waiting for an answer keeps waiting, as behind a real ser2net. What it
        says while nobody is connected is lost, as on a serial line nobody reads.
        """
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _AdapterSocket(self), host, port)
        _LOGGER.debug("virtual adapter listening on %s", self.port)

    def _connection_made(self, transport: asyncio.Transport) -> None:
        if self._client is not None:
            self._client.abort()
        self._client = transport
        self._buffer.clear()
        _LOGGER.debug("virtual adapter: agent connected")

    def _connection_lost(self, transport: asyncio.Transport) -> None:
        if self._client is transport:
            self._client = None
            self._buffer.clear()
            _LOGGER.debug("virtual adapter: agent disconnected")

    def plug(self) -> None:
        """Plug the adapter in: a new pty with a new /dev/pts name (like USB re-enumeration)."""
        if self._pty is not None:
            return
        master, slave = os.openpty()
        if os.ttyname(slave) == self._last_name:
            # The kernel reuses the freed number; a re-enumerated USB adapter rarely does.
            spare = (master, slave)
            master, slave = os.openpty()
            os.close(spare[0])
            os.close(spare[1])
        self._last_name = os.ttyname(slave)
        tty.setraw(slave)  # no echo, no line editing: a serial line, not a terminal
        os.set_blocking(master, False)
        self._pty = _Pty(master, slave, os.ttyname(slave))
        self._buffer.clear()
        asyncio.get_running_loop().add_reader(master, self._read_ready)
        if self.options.link_path is not None:
            temporary = self.options.link_path.with_name(self.options.link_path.name + ".new")
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
            temporary.symlink_to(self._pty.name)
            temporary.replace(self.options.link_path)
        _LOGGER.debug("virtual adapter plugged in at %s", self._pty.name)

    def unplug(self) -> None:
        """Pull the USB cable: the pty disappears and the agent's reads fail."""
        if not self._close_pty():
            return
        if self.options.link_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.options.link_path.unlink()
        self._abort_session()
        self.status = Status.INACTIVE
        self._enabled.clear()
        _LOGGER.debug("virtual adapter unplugged")

    def glitch(self) -> None:
        """A USB glitch: the adapter's link drops and comes back at once (a new pty, as a
        re-enumerated adapter), while the controller goes on with its session: a vend under way
        still ends, and its result is said on the new link."""
        if self._close_pty():
            self.plug()

    def _close_pty(self) -> bool:
        pty_, self._pty = self._pty, None
        if pty_ is None:
            return False
        asyncio.get_running_loop().remove_reader(pty_.master)
        os.close(pty_.master)
        os.close(pty_.slave)
        return True

    def send(self, line: str) -> None:
        self.send_raw((line + "\n").encode("ascii"))

    def send_raw(self, data: bytes) -> None:
        """Anything on the wire, garbage included."""
        if self._wire is not None:
            self._wire.write(data)
            return
        if self._client is not None:
            self._client.write(data)
            return
        if self._pty is None:
            return
        try:
            written = os.write(self._pty.master, data)
        except OSError as err:  # the agent is not reading and the pty is full
            _LOGGER.debug("virtual adapter write dropped: %s", err)
            return
        self.written += written
        if written < len(data):
            _LOGGER.debug("virtual adapter wrote %d of %d bytes", written, len(data))

    def _read_ready(self) -> None:
        if self._pty is None:
            raise RuntimeError("the controller is not started")
        try:
            data = os.read(self._pty.master, 4096)
        except OSError:
            return
        self.feed(data)

    def feed(self, data: bytes) -> None:
        """Bytes from the agent, whatever the transport: complete lines are acted on."""
        self._buffer += data
        while (index := self._buffer.find(b"\n")) >= 0:
            line = self._buffer[:index].decode("ascii", "replace").strip()
            del self._buffer[: index + 1]
            if line:
                self._on_agent_line(line)

    # -- the agent's commands ------------------------------------------------------------------

    def _on_agent_line(self, line: str) -> None:
        self.received.append(line)
        del self.received[:-1000]
        try:
            command = wire.parse_agent_line(line, self.options.unit)
        except wire.ProtocolError:
            self.unexpected.append(line)
            self.send("c,ERR,unknown command")
            return
        verb = command.verb
        if verb == "0":
            self._abort_session()
            self._set_status(Status.INACTIVE)
        elif verb == "SETCONF":
            self.send("r,ACK")
        elif verb == "1":
            self.send("c,1")
            self._tasks.spawn(self._enable())
        elif verb == "STATUS":
            waiting = self._answer is not None and not self._answer.done()
            if self.options.status_repeats_vend and waiting and self._vend_request:
                self.send(self._vend_request)
            else:
                self.send(wire.status_line(self.status))
        elif verb == "VEND":
            self._answer_vend(command.amount_cents)
        elif verb == "STOP":
            self._answer_vend(None)
        elif verb == "START":
            self._open_session(command.amount_cents or 0)

    def _answer_vend(self, amount: int | None) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_result(amount)
        elif amount is None and self._in_session:
            # The agent closed an open session nobody used (card first: session timeout).
            if self._session_funds is not None and not self._session_funds.done():
                self._session_funds.set_result(None)
            self._in_session = False
            self._set_status(Status.ENABLED)
        elif amount is not None:
            self.unexpected.append(f"C,VEND with no vend request ({amount})")

    def _open_session(self, funds: int) -> None:
        if self.status is not Status.ENABLED or self._in_session:
            self.send("c,ERR,START -1")
            return
        self._in_session = True
        self.send(wire.status_line(Status.IDLE, funds, self.options.unit))
        nobody_waits = self._session_funds is None or self._session_funds.done()
        if nobody_waits and self.closing.is_set():
            # Closing, and the customer it was for has left (a START crossing the close on the
            # wire): the session ends unused at once, as when a customer walks away, so the
            # agent gives the money back now instead of waiting out its vend timeout.
            self._in_session = False
            self._set_status(Status.ENABLED)
            return
        if nobody_waits:
            self._session_funds = asyncio.get_running_loop().create_future()
        if self._session_funds is None:
            raise RuntimeError("no session waits for funds")
        self._session_funds.set_result(funds)

    @property
    def enabling(self) -> bool:
        """Whether an enable sequence (after ``C,1`` or a reset) is still to say its states."""
        return len(self._tasks) > 0

    async def _enable(self) -> None:
        """The controller polls the reader and enables it, unless something intervenes."""
        epoch = self._epoch
        await asyncio.sleep(self.options.enable_delay)
        if self._epoch != epoch or not self.plugged:
            return
        if self.status is Status.INACTIVE:
            self._set_status(Status.DISABLED)
        await asyncio.sleep(self.options.enable_delay)
        if self._epoch == epoch and self.plugged:
            self._set_status(Status.ENABLED)

    def _set_status(self, status: Status) -> None:
        self.status = status
        if status is Status.ENABLED:
            self._enabled.set()
        else:
            self._enabled.clear()
        self.send(wire.status_line(status))

    # -- quirks on demand ----------------------------------------------------------------------

    def reset(self) -> None:
        """The controller resets (power blip, service mode): any session is gone."""
        self._abort_session()
        self._set_status(Status.INACTIVE)
        self._tasks.spawn(self._enable())

    def disable(self) -> None:
        self._abort_session()
        self._set_status(Status.DISABLED)

    def enable(self) -> None:
        self._set_status(Status.ENABLED)

    def repeat_enable(self, times: int = 3) -> None:
        for _ in range(times):
            self.send(wire.status_line(Status.ENABLED))

    def _abort_session(self) -> None:
        self._epoch += 1
        self._in_session = False
        # A customer still waiting for a session (card first) just keeps waiting.
        if self._answer is not None and not self._answer.done():
            self._answer.set_result(_ABORTED)

    # -- customers -----------------------------------------------------------------------------

    @property
    def in_visit(self) -> bool:
        """Whether a customer is at the machine (selecting, paying or taking the product)."""
        return self._visit_lock.locked()

    async def wait_enabled(self) -> None:
        await self._enabled.wait()

    async def customer(
        self,
        product: str,
        *,
        fail: bool = False,
        no_result: bool = False,
        walk_away_after: float | None = None,
        unheard: bool = False,
        phantom: bool = False,
    ) -> Visit:
        """Selection first: choose ``product``, wait for the agent's answer, take the goods.

        Two faults of the machine's own books against what it tells the agent: ``unheard``, the
        product drops (and is counted) but the agent hears a failed vend (a power cut
        mid-dispense: the money goes back for goods that came out); ``phantom``, the agent hears
        a vend that never happened (nothing drops, nothing is counted: a charge for nothing)."""
        async with self._visit_lock:
            # Enabled when the customer steps up, not only when the wait began: a reset between
            # the two (the wake-up is not immediate) leaves the reader off the bus.
            await self._step_up()
            visit = self._new_visit(product)
            if self.closing.is_set():  # closed while this customer stepped up: no choice made
                self._close_visit(visit, VisitOutcome.WALKED_AWAY)
                return visit
            self._in_session = True
            try:
                await self._sell(visit, fail=fail, no_result=no_result, patience=walk_away_after,
                                 unheard=unheard, phantom=phantom)
            finally:
                self._in_session = False
            return visit

    async def _step_up(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while self.status is not Status.ENABLED or self.enabling:
                if self.enabling:
                    # the controller still polls the reader after C,1 or a reset: its states
                    # come before any selection (ENABLED already, from a visit that ended as
                    # the reset came, then its enable sequence's ENABLED after the selection
                    # ended that session on the agent's side: the customer was never answered)
                    await asyncio.sleep(self.options.enable_delay)
                else:
                    await self.wait_enabled()
            gap = self._walked_away_at + self.options.step_up_time - loop.time()
            if gap <= 0:
                return
            await asyncio.sleep(gap)  # then look again: a reset may have come meanwhile

    async def card_first_customer(
        self, product: str | None, *, fail: bool = False, wait: float = 60.0
    ) -> Visit:
        """Card first: wait for the agent to open a session, then choose (None: walk away)."""
        async with self._visit_lock:
            visit = self._new_visit(product)
            loop = asyncio.get_running_loop()
            if self._session_funds is None or (self._session_funds.done() and not self._in_session):
                self._session_funds = loop.create_future()
            try:
                try:
                    funds = await asyncio.wait_for(asyncio.shield(self._session_funds), wait)
                except TimeoutError:  # no session was ever offered: the customer leaves
                    self._close_visit(visit, VisitOutcome.WALKED_AWAY)
                    return visit
                if funds is None or funds == _ABORTED:
                    self._close_visit(visit, VisitOutcome.ABORTED)
                    return visit
                visit.funds_cents = funds
                self._notify("session", visit)
                # closed while the session was offered (another machine's customer was the
                # last one): this one chooses nothing, as one who walks away
                if product is None or self.closing.is_set():
                    self._close_visit(visit, VisitOutcome.WALKED_AWAY)
                    self._in_session = False
                    self._set_status(Status.ENABLED)
                    return visit
                await self._sell(visit, fail=fail, no_result=False, patience=None)
            finally:
                self._in_session = False
                self._session_funds = None
            return visit

    def _new_visit(self, product: str | None) -> Visit:
        self._number += 1
        price = self.options.products[product] if product is not None else 0
        visit = Visit(self._number, product, price)
        self.visits.append(visit)
        return visit

    def _notify(self, what: str, visit: Visit) -> None:
        for observer in list(self.observers):
            try:
                observer(what, visit)
            except Exception:
                _LOGGER.exception("virtual controller observer failed")

    def _close_visit(self, visit: Visit, outcome: VisitOutcome) -> None:
        visit.outcome = outcome
        self._notify(outcome.value, visit)

    async def cash_customer(self, product: str) -> None:
        """A customer who pays in coins: the agent takes no part, the machine counts it (CA2)."""
        async with self._visit_lock:
            self._dropped(product, self.options.products[product], "cash")

    def stock_columns(
        self, capacity: Mapping[str, int],
        before_refill: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """The columns hold ``capacity`` (a `dex:` planogram), full now. A column sold out is
        chosen by no random customer; once every one is, the tech comes: ``before_refill``
        (the agent reads the books and records the refill), then every column is full again.
        A real machine vends no more from a column than it holds: without this the machine's
        PA2 counted more sales of a column since its refill than the column holds."""
        self.capacity = {column: count for column, count in capacity.items()
                         if column in self.options.products}
        self.stock = dict(self.capacity)
        self._before_refill = before_refill

    def in_stock(self) -> list[str]:
        """The products a customer can choose now, sorted."""
        return sorted(p for p in self.options.products if self.stock.get(p, 1) > 0)

    async def refill(self) -> None:
        """The tech fills every column (the agent told first, as a tech reads the books just
        before filling)."""
        if self._before_refill is not None:
            await self._before_refill()
        self.stock = dict(self.capacity)

    def _dropped(self, product: str, price: int, payment: Payment) -> None:
        """A product came out: the books count it, its column holds one fewer."""
        self.books.vend(product, price, payment)
        if product in self.stock:
            self.stock[product] = max(0, self.stock[product] - 1)

    async def _sell(
        self,
        visit: Visit,
        *,
        fail: bool,
        no_result: bool,
        patience: float | None,
        unheard: bool = False,
        phantom: bool = False,
    ) -> None:
        if visit.product is None:
            raise RuntimeError("a visit with no product")
        epoch = self._epoch
        self._answer = asyncio.get_running_loop().create_future()
        self._notify("selects", visit)
        loop = asyncio.get_running_loop()
        visit.requested_at = loop.time()
        self._vend_request = wire.vend_request_line(
            visit.price_cents, visit.product, self.options.unit
        )
        self.send(self._vend_request)
        try:
            amount = await asyncio.wait_for(
                asyncio.shield(self._answer), patience or self.options.patience
            )
        except TimeoutError:
            self._walked_away_at = loop.time()
            self._close_visit(visit, VisitOutcome.WALKED_AWAY)
            self._set_status(Status.ENABLED)  # the controller ends the session
            return
        visit.answered_at = loop.time()
        if amount == _ABORTED:
            self._close_visit(visit, VisitOutcome.ABORTED)
            return
        if amount is None:
            self._close_visit(visit, VisitOutcome.DENIED)
            self._set_status(Status.ENABLED)
            return
        visit.approved_cents = amount
        self._notify("approved", visit)
        await self.clock.sleep(self.options.dispense_time)
        if self._epoch != epoch:
            self._close_visit(visit, VisitOutcome.ABORTED)
        elif no_result:
            self._close_visit(visit, VisitOutcome.NO_RESULT)  # the controller says nothing at all
        elif fail or unheard:
            if unheard:  # it dropped all the same: the machine counts it, the agent hears a fault
                self._dropped(visit.product, visit.price_cents, "cashless")
            self._close_visit(visit, VisitOutcome.FAILED)
            self.send(wire.VEND_FAILED_LINE)
            self._set_status(Status.ENABLED)
        else:
            if not phantom:  # a phantom: success said, nothing dropped, nothing counted
                self._dropped(visit.product, visit.price_cents, "cashless")
            self._close_visit(visit, VisitOutcome.VENDED)
            self.send(wire.VEND_SUCCESS_LINE)
            self.send(wire.status_line(Status.IDLE))
            self._set_status(Status.ENABLED)

    async def random_customers(
        self,
        count: int | None = None,
        *,
        card_first: bool = False,
        gap: tuple[float, float] = (0.5, 2.0),
        fail_rate: float = 0.1,
        walk_away_rate: float = 0.05,
        cash_rate: float = 0.0,
    ) -> None:
        """Customers forever (or ``count`` of them): random products, some failures, some leave,
        some pay cash (the agent takes no part; the machine's books count them)."""
        served = 0
        while (count is None or served < count) and not self.closing.is_set():
            await asyncio.sleep(self._rng.uniform(*gap))
            if self.closing.is_set():
                return
            if self.stock and not any(self.stock.values()):
                await self._refilled()  # every column sold out: the tech comes first
            products = self.in_stock()
            product: str | None = self._rng.choice(products)
            fail = self._rng.random() < fail_rate
            if card_first and self._rng.random() < walk_away_rate:
                product = None
            try:
                if product is not None and self._rng.random() < cash_rate:
                    await self.cash_customer(product)
                elif card_first:
                    await self._unless_closing(self.card_first_customer(product, fail=fail))
                elif product is not None:
                    await self._unless_closing(self.customer(product, fail=fail))
            except Exception:  # one odd visit must not empty the shop for the rest of the demo
                _LOGGER.exception("virtual customer failed")
            served += 1

    async def _refilled(self) -> None:
        try:
            await self.refill()
        except Exception:  # the agent's side of a refill failing leaves the shop open
            _LOGGER.exception("virtual machine: the refill's record failed")
            self.stock = dict(self.capacity)

    def close(self) -> None:
        """No new customer. A session the agent opened that no customer has taken (card
        first: the simulator taps a card on every interaction) ends unused at once, as when a
        customer walks away: the agent gives its money back now, not at its vend timeout."""
        self.closing.set()
        if self._in_session and not self._visit_lock.locked():
            self._session_funds = None
            self._in_session = False
            self._set_status(Status.ENABLED)

    async def _unless_closing(self, visit: Coroutine[Any, Any, Visit]) -> None:
        """A visit, unless the machine closes before the customer is in a session: one still
        waiting (for an out-of-service reader to come back, for a session to be offered)
        leaves at once, so a stop is not held up by a reader that may never return. A customer
        in a session finishes it (a vend in flight is heard to its end)."""
        visiting = asyncio.ensure_future(visit)
        closing = asyncio.ensure_future(self.closing.wait())
        try:
            await asyncio.wait({visiting, closing}, return_when=asyncio.FIRST_COMPLETED)
            if not visiting.done() and not self._in_session:
                visiting.cancel()
            try:
                await visiting
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # this task is being cancelled, not only the visit
        finally:
            closing.cancel()
            if not visiting.done():
                visiting.cancel()

    def tally(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for visit in self.visits:
            key = visit.outcome.value if visit.outcome else "open"
            counts[key] = counts.get(key, 0) + 1
        return counts


class _AdapterSocket(asyncio.Protocol):
    def __init__(self, controller: VirtualController) -> None:
        self.controller = controller
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not isinstance(transport, asyncio.Transport):
            raise TypeError(f"transport: {type(transport).__name__}, not Transport")
        self.transport = transport
        self.controller._connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.transport is self.controller._client:
            self.controller.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.controller._connection_lost(self.transport)


# -- the machine's own record --------------------------------------------------------------------

# observer step -> record event; every outcome is followed by one ``session_end`` line
RECORD_EVENTS = {
    "selects": "selection",
    "session": "session_offered",  # card first: the agent opened a session with these funds
    "approved": "approval",
    VisitOutcome.DENIED.value: "denial",
    VisitOutcome.VENDED.value: "dispensed",
    VisitOutcome.FAILED.value: "dispense_failed",
}


_OUTCOMES = frozenset(outcome.value for outcome in VisitOutcome)


class VisitRecorder:
    """The machine's own record, one JSON object a line, flushed at once (a test reads it live).

    Each line: ``event`` (``selection``, ``session_offered``, ``approval``, ``denial``,
    ``dispensed``, ``dispense_failed``, ``session_end``), ``machine``, ``visit`` (its number),
    ``product``, ``price_cents``, ``approved_cents``, ``funds_cents``, ``vended_cents`` (what came
    out: the price on ``dispensed``, else 0), ``at`` (Unix seconds); ``session_end`` adds
    ``outcome`` (a ``VisitOutcome``). Amounts are integer cents.
    """

    def __init__(self, out: IO[str], machine: str) -> None:
        self.out = out
        self.machine = machine

    def attach(self, controller: VirtualController) -> None:
        controller.observers.append(self)

    def __call__(self, what: str, visit: Visit) -> None:
        event = RECORD_EVENTS.get(what)
        if event is not None:
            self.write(event, visit)
        if what in _OUTCOMES:
            self.write("session_end", visit, outcome=what)

    def write(self, event: str, visit: Visit, **extra: Any) -> None:
        dispensed = event == "dispensed" or extra.get("outcome") == VisitOutcome.VENDED.value
        vended = visit.price_cents if dispensed else 0
        line = {
            "event": event,
            "machine": self.machine,
            "visit": visit.number,
            "product": visit.product,
            "price_cents": visit.price_cents,
            "approved_cents": visit.approved_cents,
            "funds_cents": visit.funds_cents,
            "vended_cents": vended,
            "at": time.time(),
            **extra,
        }
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()


def read_record(path: Path) -> list[dict[str, Any]]:
    """A machine's record as written by ``VisitRecorder`` (a torn last line is left out)."""
    lines: list[dict[str, Any]] = []
    for text in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            lines.append(json.loads(text))
    return lines


def make_machine(
    *, products: dict[str, int], dispense_time: float, dex: bool, seed: int | None
) -> VirtualController:
    """The factory the CLI gives the agent for its ``virtual`` triggers (``Agent.machines``):
    a machine with these products, not started yet."""
    options = ControllerOptions(products=products, dispense_time=dispense_time, dex=dex)
    return VirtualController(options, seed=seed)
