"""`kiosk-agent demo`: the simulator, a virtual vending machine and the agent, with a live view.

Everything runs in this process: the service simulator on a loopback port, the virtual vending
machine controller on a pseudo-terminal, and the agent configured by config/demo.yaml. The
view shows customers choosing, cards, approvals and declines, dispenses, voids and receipts with a
running total; plain lines when standard output is not a terminal, no colours with NO_COLOR set.
Ctrl-C ends it cleanly; --sales N or --duration S end it by themselves.

Out of service: press o (on a terminal) to take the first reader's terminal offline in the
simulator and again to bring it back, or give --outage S (offline after S seconds, for 10 s):
the view shows the reader stepping aside while the machine goes on selling for cash.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import secrets
import sys
import time
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kiosk_agent.cli.contract import (
    EXIT_FAILED,
    EXIT_JOURNAL_OWNED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    StopSignals,
    described,
    guarded,
    is_tty,
    load,
    options,
    positive_int,
    program_command,
    use_colour,
)
from kiosk_agent.moments import display_clock
from kiosk_agent.money import format_cents
from kiosk_agent.sales.kinds import Tally, no_selection
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.states import SaleState
from kiosk_agent.tasks import TaskSet, cancel_and_wait

if TYPE_CHECKING:
    from kiosk_agent.bus import Subscription
    from kiosk_agent.health.availability import TerminalState

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "config" / "demo.yaml"
# At the end, how long the machine's last sale may take to end before its books are read anyway.
AUDIT_WAIT_S = 5.0

_COLOURS = {
    "dim": "\x1b[2m",
    "green": "\x1b[32m",
    "red": "\x1b[31m",
    "yellow": "\x1b[33m",
    "cyan": "\x1b[36m",
    "bold": "\x1b[1m",
    "reset": "\x1b[0m",
}

_STATE_COLOUR = {
    SaleState.COMPLETED: "green",
    SaleState.DECLINED: "red",
    SaleState.FAILED: "red",
    SaleState.ATTENTION: "red",
    SaleState.REVERSED: "yellow",
    SaleState.CANCELLED: "yellow",
}

_STEP_TEXT = {
    SaleState.STARTED: "sale opened",
    SaleState.READING_CARD: "present a card",
    SaleState.AUTHORIZING: "authorizing",
    SaleState.CHARGING: "charging",
    SaleState.DISPENSING: "approved: vending",
    SaleState.CAPTURING: "capturing",
    SaleState.REVERSING: "giving the money back",
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = subparsers.add_parser(
        "demo",
        help="simulator + virtual vending machine + agent, with a live view (no hardware)",
        description=described(__doc__, "demo"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=options(json=False),
    )
    demo.add_argument(
        "--sales", type=positive_int,
        help="end after this many sales have ended (a card session no one chose in is no sale)",
    )
    demo.add_argument("--duration", type=float, help="end after this many seconds")
    demo.add_argument(
        "--speed", type=float, default=1.0, help="customers and simulated time N times faster"
    )
    demo.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    demo.add_argument(
        "--outage",
        type=float,
        metavar="S",
        help="take the first terminal offline after S seconds, for 10 s (or press o)",
    )
    demo.set_defaults(handler=guarded(demo_command))


class LiveView:
    """What happens at the machine and in the sale, one line each, and a running total."""

    def __init__(self, out: TextIO, *, fancy: bool, colour: bool | None = None) -> None:
        self.out = out
        self.fancy = fancy  # a redrawn running total (a terminal)
        self.colour = fancy if colour is None else colour and fancy
        self.started = time.monotonic()
        self.tally = Tally()  # the sales that ended, by the rule of every face (sales.kinds)
        self._status_shown = False
        self._last_state: dict[str, SaleState] = {}  # a sale's steps repeat a state: show it once
        self.customers: Customers | None = None  # --sales N: which sales count
        self._starting: set[str] = set()  # terminals last shown starting: in service, not back

    # -- inputs --------------------------------------------------------------------------------

    def machine(self, source: str, what: str, visit: Any) -> None:
        if self.customers is not None:
            self.customers.customer(source, what, visit.number)
        if what == "approved":
            return  # the sale's own "approved: vending" step says it
        product = visit.product
        price = format_cents(visit.price_cents)
        text = {
            "selects": f"customer #{visit.number} selects {product} ({price})",
            "session": f"customer #{visit.number}: card accepted, "
            f"{format_cents(visit.funds_cents or 0)} to spend",
            "vended": f"{product} dropped into the tray",
            "failed": f"{product} stuck: the machine reports a failed vend",
            "denied": f"machine told no: customer #{visit.number} gets nothing",
            "walked_away": f"customer #{visit.number} walked away",
            "aborted": f"customer #{visit.number}: session aborted by the machine",
            "no_result": f"{product}: the machine never reported the result",
        }.get(what, what)
        colour = {"vended": "green", "failed": "red", "denied": "red"}.get(what, "cyan")
        self._line(source, text, colour)

    def sale(self, event: SaleEvent) -> None:
        if self._last_state.get(event.sale_id) is event.state:
            return
        self._last_state[event.sale_id] = event.state
        if event.state.final:
            del self._last_state[event.sale_id]
            self.tally.add(event)
            if no_selection(event):
                # a card-first machine's session that no one chose in: not a sale anywhere
                self._line(event.source, f"card session ended with no selection "
                           f"({event.state.value}, {format_cents(0)} kept): not a sale", "dim")
                return
            text = f"{event.state.value.upper()}: {event.message or ''}".rstrip(": ")
            self._line(event.source, text, _STATE_COLOUR.get(event.state, "bold"))
            return
        step = _STEP_TEXT.get(event.state, event.state.value)
        message = event.message or ""
        if message.lower().startswith(step.lower()):
            text = message  # "present a card on ...": says the step already
        elif message:
            text = f"{step} ({message})"
        else:
            text = step
        self._line(event.source, text, "dim")

    def show(self, event: SaleEvent) -> None:
        if event.receipt:
            self.receipt(event.source, event.message)
        else:
            self.sale(event)

    def note(self, text: str) -> None:
        self._line("demo", text, "yellow")

    def availability(self, state: TerminalState) -> None:
        """A terminal waiting for the agent's start, out of service (the reader steps aside),
        or taking cards: in the words of `kiosk-agent health`."""
        was_starting = state.device_id in self._starting
        if state.available:
            self._starting.discard(state.device_id)
            text = ("in service: card readers enabled" if was_starting
                    else "back in service: card readers enabled again")
            self._line(state.device_id, text, "green")
            return
        from kiosk_agent.health.availability import unavailable_text  # not for `demo --help`

        out = unavailable_text(starting=state.starting, since=state.since, reason=state.reason)
        if state.starting:
            self._starting.add(state.device_id)
            self._line(state.device_id, f"{out}; the reader waits for the agent's start, the "
                       "machine sells for cash", "yellow")
        else:
            self._starting.discard(state.device_id)
            self._line(state.device_id, f"{out}; the reader steps aside, the machine sells "
                       "for cash", "red")

    def receipt(self, source: str, note: str) -> None:
        self._line(
            source,
            note,
            "green" if note.startswith("receipt ") and " not " not in note else "yellow",
        )

    # -- output --------------------------------------------------------------------------------

    def totals(self) -> str:
        return self.tally.text()

    def summary(self, journal: Tally | None = None) -> None:
        """The end: the journal's count of the demo's sales (``journal``), as `kiosk-agent
        sales` lists them; else what the view saw end."""
        self._clear_status()
        elapsed = time.monotonic() - self.started
        totals = (journal or self.tally).text()
        self.out.write(f"demo ended after {elapsed:.1f}s: {totals}\n")
        self.out.flush()

    def _line(self, source: str, text: str, colour: str) -> None:
        stamp = display_clock(time.time())  # UTC, as the status page it links
        if self.fancy:
            self._clear_status()
            paint = _COLOURS if self.colour else dict.fromkeys(_COLOURS, "")
            c, reset, dim = paint[colour], paint["reset"], paint["dim"]
            self.out.write(f"{dim}{stamp}{reset} {source:<16} {c}{text}{reset}\n")
            self.out.write(f"{paint['bold']}  total: {self.totals()}{reset}")
            self._status_shown = True
        else:
            self.out.write(f"{stamp} {source} {text}\n")
        self.out.flush()

    def _clear_status(self) -> None:
        if self._status_shown:
            self.out.write("\r\x1b[K")
            self._status_shown = False


class Customers:
    """``--sales N``: the sales of the first N customers who choose, and no customer after.

    A customer's sale is a sale once they choose (sales.kinds, the rule of every face): the
    sale opens after the choice (selection first), or the machine opened it in advance and the
    customer took it (card first: ``session``, then the choice). A customer who takes a card
    session and walks away chose nothing: no sale, not counted. Once the N-th customer has
    chosen, the machines take no one new; the demo ends when those N sales have ended, so it
    shows exactly N (a session a card-first machine opened for a next customer who never comes
    is closed at the stop: a session with no selection, counted apart).
    """

    def __init__(self, limit: int, machines: list[Any]) -> None:
        self.limit = limit
        self.machines = machines
        self.arrived = 0
        self.counted: set[str] = set()
        self.ended: set[str] = set()
        self._open: dict[str, str] = {}  # machine -> its sale under way
        self._waiting: Counter[str] = Counter()  # machine -> customers whose sale is to open
        self._seen: set[tuple[str, int]] = set()  # (machine, customer number)
        self._sessions: dict[tuple[str, int], str] = {}  # card first: the session taken

    def customer(self, source: str, what: str, number: int) -> None:
        """A machine's observer: a customer took the session (card first) or chose."""
        if what == "session":
            sale_id = self._open.get(source)
            if sale_id is not None:
                self._sessions[(source, number)] = sale_id
            return
        if what != "selects" or (source, number) in self._seen or self.arrived >= self.limit:
            return
        self._seen.add((source, number))
        self.arrived += 1
        sale_id = self._sessions.pop((source, number), None)
        if sale_id is not None and sale_id not in self.counted:
            self.counted.add(sale_id)
        else:
            self._waiting[source] += 1
        if self.arrived >= self.limit:
            for machine in self.machines:
                machine.controller.close()  # no new customer

    def sale(self, event: SaleEvent) -> None:
        if event.receipt:
            return
        if event.sale_id not in self._open.values() and event.sale_id not in self.ended:
            self._open[event.source] = event.sale_id
            if self._waiting[event.source]:
                self._waiting[event.source] -= 1
                self.counted.add(event.sale_id)
        if event.state.final:
            self.ended.add(event.sale_id)
            if self._open.get(event.source) == event.sale_id:
                del self._open[event.source]

    @property
    def done(self) -> bool:
        waiting = sum(self._waiting.values())
        return self.arrived >= self.limit and not waiting and self.counted <= self.ended


def _speed_up(config: Any, speed: float) -> None:
    """Scale simulated time and customer pace."""
    simulator = config.data["service"].get("simulator")
    if simulator is not None:
        simulator["time_scale"] = simulator["time_scale"] * speed
    for trigger in config.data.get("triggers", []):
        if trigger.get("platform") != "virtual":
            continue
        trigger["gap"] = [g / speed for g in trigger["gap"]]
        trigger["dispense_time"] = trigger["dispense_time"] / speed


async def demo_command(args: argparse.Namespace) -> int:
    config = load(_demo_config(args))
    if "simulator" not in config["service"]:
        raise CliError("the demo needs `service: {simulator: ...}` in its configuration",
                       EXIT_USAGE)
    if args.speed <= 0:
        raise CliError("--speed must be above zero", EXIT_USAGE)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    _speed_up(config, args.speed)
    page_token = _with_status_page(config)
    return await _run(config, args, page_token)


def demo_journal(config: Any) -> Path:
    """Where the demo keeps its sales: the configuration's journal (config/demo.yaml: under the
    user's state directory), so `kiosk-agent sales -c config/demo.yaml` reads them afterwards.
    The bundled demo starts a new one each run (a sale the last run left open would be
    recovered against a simulator that never saw it); a configuration of one's own keeps its
    journal as it is."""
    from kiosk_agent.sales.journal import JournalError, marker_path, side_files
    from kiosk_agent.sales.owner import JournalLock

    path = Path(config.resolve(config["journal"]["path"]))
    if Path(config.path).resolve() == DEFAULT_CONFIG.resolve():
        try:
            # only while no other demo runs on it: the journal's owner lock says so
            with JournalLock(path):
                # the in-use marker too: a journal deleted on purpose is not a journal lost
                for part in (path, *side_files(path), marker_path(path)):
                    part.unlink(missing_ok=True)
        except JournalError as err:  # another demo (or agent) is using it: say who
            raise _journal_refused(err) from None
    return path


def _journal_refused(err: Exception) -> CliError:
    """A journal the demo cannot have, said as `run` says it (no "unexpected" error): another
    demo or agent owns it, exit 5, naming who (the exit codes' one table); a read-only disk or
    a bad path, exit 1."""
    from kiosk_agent.sales.owner import JournalOwned

    return CliError(str(err), EXIT_JOURNAL_OWNED if isinstance(err, JournalOwned) else EXIT_FAILED)


def _journal_hint(config: Any) -> str:
    return f"{program_command(sys.argv[0])} sales -c {_shown_path(Path(config.path))}"


def _shown_path(path: Path) -> str:
    """``config/demo.yaml`` from the checkout's top, else the path as it is."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _with_status_page(config: Any) -> str | None:
    """Serve the field tech's status page on loopback with a token made for this run only,
    unless the configuration has its own admin API; the token to log in with, or None."""
    if "admin" in config.data:
        return None
    from kiosk_agent.admin.schema import ADMIN_SCHEMA

    token = secrets.token_urlsafe(18)
    config.data["admin"] = ADMIN_SCHEMA(
        {"host": "127.0.0.1", "port": 0, "tokens": [{"name": "demo", "token": token}]}
    )
    return token


def _demo_config(args: argparse.Namespace) -> Path:
    """-c/--config, else $KIOSK_CONFIG, else the bundled config/demo.yaml."""
    from kiosk_agent.cli.contract import optional_config_path

    return optional_config_path(args) or DEFAULT_CONFIG


async def _run(config: Any, args: argparse.Namespace, page_token: str | None = None) -> int:
    from kiosk_agent.app import agent_for
    from kiosk_agent.cli.embedded import embedded_simulator, simulated_machines
    from kiosk_agent.platforms.virtual import VirtualPlatform
    from kiosk_agent.sales.journal import JournalError
    from kiosk_agent.sim.machine import VirtualController

    view = LiveView(sys.stdout, fancy=is_tty(sys.stdout) and not args.plain,
                    colour=use_colour(sys.stdout))
    journal = demo_journal(config)
    began = time.time()  # the demo's sales are those created since (a config's own journal)
    signals = StopSignals("stopping the demo").install()
    admin_file: Path | None = None  # where `health -c` finds the run's admin API
    try:
        async with agent_for(
            config, systemd=False, simulator=embedded_simulator, machines=simulated_machines
        ) as (agent, service):
            if service.simulator is None:  # demo_command checked the configuration
                raise RuntimeError("the demo's agent has no simulator")
            sim_url = service.simulator.base_url
            view.note(f"simulator listening on {sim_url}; Ctrl-C stops the demo")
            view.note(f"sales journal: {journal} (kept after the demo: {_journal_hint(config)})")
            outage = Outage(sim_url, next(iter(agent.settings.terminals)), view)
            async with agent.events.subscribe() as queue, outage:
                await agent.start()
                admin_file = _announce_status_page(agent, view, page_token, journal,
                                                   service.simulator.ready_info())
                machines = [p for p in agent.platforms if isinstance(p, VirtualPlatform)]
                if args.sales is not None:
                    view.customers = Customers(args.sales, machines)
                for platform in machines:
                    # the demo's machines are the simulated ones it gave the agent
                    if not isinstance(platform.controller, VirtualController):
                        raise TypeError(f"{platform.name}: not a simulated machine")
                    observer = functools.partial(view.machine, platform.name)
                    platform.controller.observers.append(observer)
                outage.follow(agent.availability, after=args.outage)
                await _follow(queue, view, signals.event, args)
                await _show_audit(agent, view, began)
                # A sale under way now is finished or given back: show how, not a bare "told no".
                view.note("stopping: a sale under way is finished or its money given back")
                await _show_until_done(agent.stop(), queue, view)
    except JournalError as err:  # a configuration of one's own: its journal is claimed here
        raise _journal_refused(err) from None
    finally:
        signals.remove()
        if admin_file is not None:
            from kiosk_agent.cli.demo_admin import remove_demo_admin

            remove_demo_admin(admin_file)
    view.note(f"the demo's sales stay in {journal}: {_journal_hint(config)}")
    view.summary(journal_tally(config, began))
    return EXIT_OK


def journal_tally(config: Any, since: float) -> Tally:
    """The demo's sales as the journal holds them (those created since ``since``), counted by
    the rule every face counts by (sales.kinds): what `kiosk-agent sales --since` lists."""
    from kiosk_agent.cli.contract import open_journal

    tally = Tally()
    journal = open_journal(config)
    try:
        for page in journal.pages(since=since):
            for record in page:
                tally.add(record)
    finally:
        journal.close()
    return tally


async def _show_audit(agent: Any, view: LiveView, began: float) -> None:
    """The machine's books at the end (a `dex:` section): one last read once the machine's
    sales have ended, and what `kiosk-agent audit --since` the demo's start prints: every
    interval of the run (a refill's read cuts one), each with its verdict, and their sums."""
    from kiosk_agent.cli.audit import audit_table

    books = next((c for c in agent.components if type(c).__name__ == "AuditReads"), None)
    if books is None:
        return
    for platform in agent.platforms:  # no new customer: the last sale ends, then the read
        controller = getattr(platform, "controller", None)
        if controller is not None:
            controller.close()
    view.note(f"reading the books of {books.machine} (DEX)")
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(AUDIT_WAIT_S):
            await books.read_between_sales(recheck=0.05)
    for line in audit_table(books.report(since=began)).splitlines():
        view.note(line)


def _announce_status_page(
    agent: Any, view: LiveView, token: str | None, journal: Path,
    simulator: dict[str, Any] | None = None,
) -> Path | None:
    """Say where the status page is; with a token made for the run, write where `health -c`
    and `events -c` find it, and the service commands its simulator (cli/demo_admin.py, 0600
    beside the journal): the file, or None."""
    admin = next((c for c in agent.components if type(c).__name__ == "AdminServer"), None)
    if admin is None:
        return None
    login = f" (log in with {token}, a token made for this demo run)" if token else ""
    view.note(f"status page: {admin.url}/{login}")
    if token is None:
        return None  # the configuration's own admin API: health finds it there
    from kiosk_agent.cli.demo_admin import demo_admin_path, write_demo_admin

    path = demo_admin_path(journal)
    try:
        write_demo_admin(path, admin.url, token, simulator)
    except OSError as err:
        view.note(f"cannot write {path} ({err.strerror}): `health -c` cannot find this demo")
        return None
    return path


class Outage:
    """The demo's terminal outage: ``o`` on the keyboard (or ``--outage``) takes the terminal
    offline in the simulator and brings it back; the view shows the availability changes."""

    def __init__(self, sim_url: str, device_id: str, view: LiveView) -> None:
        self.sim_url = sim_url
        self.device_id = device_id
        self.view = view
        self.offline = False
        self._tasks = TaskSet()
        self._keyboard: Any = None  # the terminal's settings while read key by key

    async def __aenter__(self) -> Outage:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._keyboard is not None:
            import termios

            asyncio.get_running_loop().remove_reader(sys.stdin.fileno())
            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, self._keyboard)
        await self._tasks.cancel_all()

    def follow(self, availability: Any, *, after: float | None) -> None:
        self._tasks.spawn(self._show(availability))
        if after is not None:
            self._tasks.spawn(self._scheduled(after))
        if sys.stdin.isatty() and self.view.fancy:
            import termios
            import tty

            self._keyboard = termios.tcgetattr(sys.stdin.fileno())
            tty.setcbreak(sys.stdin.fileno())
            asyncio.get_running_loop().add_reader(sys.stdin.fileno(), self._key)
            self.view.note(f"press o to take {self.device_id} offline (and o to bring it back)")

    async def _show(self, availability: Any) -> None:
        async with availability.changes.subscribe() as changes:
            # a terminal still starting (or out) when the view begins: its next change reads
            # as the end of that, not as a return from an outage the view never showed
            for state in availability.states():
                if not state.available:
                    self.view.availability(state)
            while True:
                self.view.availability(await changes.get())

    async def _scheduled(self, after: float) -> None:
        await asyncio.sleep(after)
        await self.toggle()
        await asyncio.sleep(10.0)
        await self.toggle()

    def _key(self) -> None:
        if sys.stdin.read(1).lower() == "o":
            self._tasks.spawn(self.toggle())

    async def toggle(self) -> None:
        import aiohttp

        self.offline = not self.offline
        state = "offline" if self.offline else "online"
        self.view.note(f"{self.device_id} goes {state} (simulator)")
        url = f"{self.sim_url}/sim/terminals/{self.device_id}/{state}"
        try:
            async with aiohttp.ClientSession() as http, http.post(url) as response:
                response.raise_for_status()
        except aiohttp.ClientError as err:
            self.view.note(f"the simulator did not take it: {err}")


async def _follow(
    queue: Subscription[SaleEvent], view: LiveView, stop: asyncio.Event, args: argparse.Namespace
) -> None:
    """Show sale events until Ctrl-C, the duration, or the sales of ``--sales N`` customers."""
    stopper = asyncio.create_task(stop.wait())
    customers = view.customers
    try:
        async with asyncio.timeout(args.duration):  # None: until Ctrl-C or --sales
            while customers is None or not customers.done:
                event = await queue.next(stopper)
                if event is None:
                    return  # Ctrl-C
                if customers is not None:
                    customers.sale(event)
                view.show(event)
    except TimeoutError:
        return  # the duration is over
    finally:
        await cancel_and_wait(stopper)


async def _show_until_done(
    work: Coroutine[Any, Any, None], queue: Subscription[SaleEvent], view: LiveView
) -> None:
    """Show the sale events published while ``work`` (the agent's stop) runs, then the rest."""
    task = asyncio.ensure_future(work)
    while (event := await queue.next(task)) is not None:
        view.show(event)
    await task
    while not queue.empty():
        view.show(queue.get_nowait())
