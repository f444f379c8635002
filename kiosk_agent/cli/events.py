"""`kiosk-agent events` and `kiosk-agent health --watch`: follow a running agent live.

Both read the admin API's event stream (``GET /api/events``, server-sent events, the stream the
status page follows): sale steps as the agent journals them, status changes, problems raised
and cleared, readers that stop or start taking cards. A field tech at the machine gets what
``journalctl -f`` or ``stripe logs tail`` give: a line per event as it happens, or with
``--json`` one JSON object a line, until Ctrl-C (exit 130, per the contract's table).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kiosk_agent.cli.contract import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    CliError,
    guarded,
    options,
    timeout_of,
    wants_json,
)
from kiosk_agent.export import stream_json
from kiosk_agent.moments import display_clock
from kiosk_agent.sales.kinds import NOT_A_SALE, SaleKind

if TYPE_CHECKING:
    import aiohttp

# What `--kind` picks from: a sale step, or one of the changes the stream says in words.
KINDS = ("sale", "status", "problem", "cleared", "availability", "audit")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from kiosk_agent.cli.fleet import add_admin_address

    events = subparsers.add_parser(
        "events",
        help="follow a running agent live: sale steps, problems, readers in and out of service",
        description="Follow a running agent's events over its admin API, as they happen, until "
        "Ctrl-C: each sale step, status changes, problems raised and cleared, readers that stop "
        "or start taking cards. The address and token come from the configuration "
        "(-c/--config or $KIOSK_CONFIG), or --url with the token in $KIOSK_AGENT_TOKEN or "
        "--token-file.",
        parents=options(timeout=True),
    )
    add_admin_address(events)
    events.add_argument(
        "--terminal", metavar="DEVICE",
        help="only this terminal's events (its device id, or its name in the configuration)",
    )  # fmt: skip
    events.add_argument(
        "--sale", metavar="SALE", help="only this sale (its id, a start of it, or its order id)"
    )
    events.add_argument(
        "--kind", action="append", choices=KINDS, metavar="KIND",
        help=f"only these kinds (repeatable): {', '.join(KINDS)}",
    )  # fmt: skip
    events.set_defaults(handler=guarded(events_command))


@dataclass
class Filters:
    terminal: str | None = None
    sale: str | None = None
    kinds: frozenset[str] = field(default_factory=frozenset)
    device_id: str | None = None  # the terminal's device id, once a health snapshot named it

    def learn(self, snapshot: dict[str, Any]) -> str | None:
        """A terminal given by name (``--terminal front``): its device id, from the agent's
        health (the stream's first event), which events carry. A terminal the agent does not
        have: what to tell the person (a typo would otherwise show nothing, for ever)."""
        terminals = snapshot.get("terminals") or ()
        for terminal in terminals:
            if self.terminal in (terminal.get("device_id"), terminal.get("name")):
                self.device_id = terminal.get("device_id")
                return None
        if self.terminal is None or not terminals:
            return None
        known = ", ".join(
            f"{t.get('device_id')} ({t['name']})" if t.get("name") else str(t.get("device_id"))
            for t in terminals
        )
        return f"warning: this agent has no terminal {self.terminal!r} (it has {known})"

    def wants(self, kind: str, data: dict[str, Any]) -> bool:
        if self.kinds and kind not in self.kinds:
            return False
        if self.terminal is not None and not self._about_terminal(kind, data):
            return False
        if self.sale is not None:
            if kind != "sale":
                return False
            ids = (str(data.get("sale_id", "")), str(data.get("order_id", "")))
            if not (ids[0].startswith(self.sale) or ids[1] == self.sale):
                return False
        return True


    def _about_terminal(self, kind: str, data: dict[str, Any]) -> bool:
        """A line of the terminal: its sale steps, and any note naming it (a problem or a
        clear says its device id; an older agent's notes carry no device_id)."""
        import re

        names = {n for n in (self.terminal, self.device_id) if n}
        if (data.get("terminal") or data.get("device_id")) in names:
            return True
        text = "" if kind == "sale" else str(data.get("text", ""))
        return any(re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text) for n in names)


async def events_command(args: argparse.Namespace) -> int:
    filters = Filters(args.terminal, args.sale, frozenset(args.kind or ()))
    as_json = wants_json(args)

    warned = False

    def show(kind: str, data: dict[str, Any]) -> None:
        nonlocal warned
        if kind == "health":
            warning = filters.learn(data.get("health") or {})
            if warning and not warned:
                print(warning, file=sys.stderr, flush=True)
                warned = True
            return
        if kind == "doctor":
            return
        if kind == "gap":  # whatever the filters: the steps lost may be the ones wanted
            say_gap(data)
            if as_json:
                print(json.dumps(stream_json({"kind": kind, **data})), flush=True)
            return
        if kind == "note":
            kind = data.get("kind") or "status"
        if not filters.wants(kind, data):
            return
        print(json.dumps(stream_json({"kind": kind, **data})) if as_json
              else event_line(kind, data), flush=True)

    return await follow(args, show)


def say_gap(data: dict[str, Any]) -> None:
    """Events lost between two lines shown (this reader fell behind the agent): said on
    standard error where they were lost, never a history with a hole shown as whole."""
    from kiosk_agent.text import for_terminal

    missed = data.get("missed")
    print(for_terminal(f"warning: {missed} event(s) missed here: this reader fell behind the "
                       "agent; `kiosk-agent sales` has every step"), file=sys.stderr, flush=True)


async def watch_health(args: argparse.Namespace) -> int:
    """``health --watch``: the snapshot again whenever it changes, until Ctrl-C."""
    from kiosk_agent.admin.page import health_changed
    from kiosk_agent.cli.fleet import format_health
    from kiosk_agent.text import for_terminal

    as_json = wants_json(args)
    printed: list[dict[str, Any]] = []  # the last snapshot printed

    def show(kind: str, data: dict[str, Any]) -> None:
        # a gap in the stream loses sale steps, not health: each snapshot is whole
        if kind != "health":
            return
        snapshot = data["health"]
        # the stream sends health again when only the status page's platforms moved (each
        # customer of a machine): the same health printed again is no change (before, a busy
        # demo's watch printed 46 snapshots in 8 s, 31 the same as the one before)
        if printed and not health_changed(printed[0], snapshot):
            return
        printed[:] = [snapshot]
        if as_json:  # as `health --json` gives it: times in ISO 8601 UTC
            print(json.dumps(stream_json(snapshot)), flush=True)
            return
        stamp = display_clock(snapshot.get("at") or time.time())
        print(f"-- {stamp}\n{for_terminal(format_health(snapshot), keep_lines=True)}", flush=True)

    return await follow(args, show)


async def follow(args: argparse.Namespace, show: Callable[[str, dict[str, Any]], None]) -> int:
    """Read the agent's event stream and hand each event to ``show`` until Ctrl-C (130) or
    SIGTERM (0). The agent restarting, or the link to it dropping, is followed through, as
    `esphome logs` does: "reconnecting" and "reconnected" said on standard error, with capped
    back-off, and the steps journaled meanwhile fetched. Only a real failure ends it with the
    table's code: no agent at all at the first try (4), the token refused (3)."""
    from kiosk_agent.cli.fleet import admin_address

    url, token = admin_address(args)
    within = timeout_of(args)
    interrupted: list[int] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        interrupted.append(signum)
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    reading = asyncio.ensure_future(_follow_through(url, token, within, show))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        for task in (reading, stopping):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if interrupted:
        return EXIT_INTERRUPTED if interrupted[0] == signal.SIGINT else EXIT_OK
    reading.result()  # the failure that ended it
    return EXIT_OK


RECONNECT_FIRST_S = 0.5  # the first wait before connecting again; doubled each try
RECONNECT_MAX_S = 10.0  # the longest wait between two tries
_KEYS_KEPT = 512  # steps remembered, so a step fetched again after a reconnect shows once


class _Lost(Exception):
    """The stream ended or could not be opened: connect again (after the first success)."""


@dataclass
class Cursor:
    """Where a follower is: what to ask for after a reconnect, what it has shown."""

    since: float | None = None  # the newest sale step's time seen, else the stream's start
    health: dict[str, Any] | None = None  # the last health snapshot seen
    connected: bool = False  # once: from then on, a lost stream is reconnected
    lost: bool = False  # between "reconnecting" and "reconnected"
    fetched: int = 0  # steps not seen before, fetched from the journal after a reconnect
    shown: dict[tuple[Any, ...], None] = field(default_factory=dict)  # recent steps, in order

    def fresh(self, data: dict[str, Any]) -> bool:
        """A sale step not shown yet (one fetched again after a reconnect shows once)."""
        key = (data.get("sale_id"), data.get("step"), data.get("state"),
               round(float(data.get("at") or 0), 3))
        if key in self.shown:
            return False
        self.shown[key] = None
        while len(self.shown) > _KEYS_KEPT:
            del self.shown[next(iter(self.shown))]
        self.since = max(self.since or 0.0, float(data.get("at") or 0))
        return True


async def _follow_through(
    url: str, token: str, within: float, show: Callable[[str, dict[str, Any]], None]
) -> None:
    from kiosk_agent.service.errors import describe

    cursor = Cursor()
    wait = RECONNECT_FIRST_S
    while True:
        try:
            await _read(url, token, within, show, cursor)
            why = "the agent ended the stream (it stopped or restarted)"
        except _Lost as lost:
            why = str(lost)
        except (OSError, TimeoutError) as err:  # not aiohttp's: a socket's own
            why = describe(err)
        if not cursor.connected:  # never reached: a wrong address, an agent not running
            raise CliError(f"cannot reach the agent at {url}: {why}", EXIT_UNREACHABLE,
                           ["is it running? `systemctl status kiosk-agent`"])
        if not cursor.lost:  # said once an outage, however many tries it takes
            wait = RECONNECT_FIRST_S
            _say(f"reconnecting to the agent at {url}: {why}")
            cursor.lost = True
        await asyncio.sleep(wait)
        wait = min(RECONNECT_MAX_S, wait * 2)


def _say(text: str) -> None:
    from kiosk_agent.text import for_terminal

    print(for_terminal(text), file=sys.stderr, flush=True)


async def _read(
    url: str, token: str, within: float, show: Callable[[str, dict[str, Any]], None],
    cursor: Cursor,
) -> None:  # fmt: skip
    import aiohttp  # here, not at import: `kiosk-agent --help` stays quick

    from kiosk_agent.cli.fleet import check_admin_answer
    from kiosk_agent.service.errors import describe

    # --timeout bounds the connection and the first answer; the stream then runs for ever
    # (the agent writes a keepalive every 10 s, so a dead link is noticed by the socket)
    timeout = aiohttp.ClientTimeout(total=None, connect=within, sock_connect=within)
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    # after a reconnect: the steps journaled since the last one shown come first
    query = {"since": repr(cursor.since)} if cursor.since is not None else None
    reconnecting = cursor.health is not None
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with asyncio.timeout(within):
                response = await session.get(
                    f"{url.rstrip('/')}/api/events", headers=headers, params=query,
                    allow_redirects=False,
                )  # fmt: skip
            async with response:
                if response.status >= 500 and cursor.health is not None:
                    raise _Lost(f"the admin API answered HTTP {response.status}")
                check_admin_answer(url, response.status, response.headers.get("Location"))
                first_health = True
                async for kind, data in server_sent_events(response.content):
                    if kind == "health":
                        snapshot = data.get("health") or {}
                        if first_health and reconnecting:
                            _changes_meanwhile(cursor.health, snapshot, show)
                        if cursor.since is None:
                            cursor.since = float(snapshot.get("at") or time.time())
                        cursor.health, first_health, cursor.connected = snapshot, False, True
                    elif kind == "replayed":
                        if cursor.lost:
                            _say(f"reconnected to the agent at {url}; {cursor.fetched} "
                                 "event(s) missed were fetched")
                        cursor.lost, cursor.fetched = False, 0
                        continue
                    elif kind == "sale":
                        if not cursor.fresh(data):
                            continue  # shown before the stream was lost
                        cursor.fetched += bool(data.get("replayed"))
                    show(kind, data)
    except (aiohttp.ClientError, TimeoutError) as err:
        raise _Lost(describe(err)) from None


def _changes_meanwhile(
    before: dict[str, Any] | None, after: dict[str, Any],
    show: Callable[[str, dict[str, Any]], None],
) -> None:  # fmt: skip
    """What changed in the agent's health while the stream was lost: said as the stream says
    a change (a new stream starts with no 'before' of its own)."""
    from kiosk_agent.admin.page import health_changes

    for note in health_changes(before, after):
        show("note", {"at": after.get("at") or time.time(), **note})


async def server_sent_events(
    lines: aiohttp.StreamReader,
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """``(event, data)`` of each server-sent event; comments (keepalives) are skipped."""
    kind, data = "message", list[str]()
    async for raw in lines:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if data:
                with contextlib.suppress(json.JSONDecodeError):
                    yield kind, json.loads("\n".join(data))
            kind, data = "message", []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            kind = line[len("event:"):].strip()
        elif line.startswith("data:"):
            data.append(line[len("data:"):].lstrip())


def event_line(kind: str, data: dict[str, Any]) -> str:
    """One event for people: ``10:15:30Z  SIM-0007  sale 3f2a9c0d  read_card.request ->
    reading_card  $5.00 requested  present a card on SIM-0007``."""
    from kiosk_agent.text import for_terminal  # on use: `--help` does not wait for it

    # UTC, as every time the command line and the status page show
    stamp = display_clock(data.get("at") or time.time())
    if kind == "sale":
        where = data.get("terminal") or data.get("source") or "-"
        move = (  # a step that could not be written moved nothing: the journal's state stands
            f"{data.get('step')}: not written, the journal holds {data.get('state')}"
            if data.get("unwritten")
            else f"{data.get('step') or data.get('state')} -> {data.get('state')}"
        )
        parts = [
            stamp, f"{where:<10}", f"sale {str(data.get('sale_id', ''))[:8]}", move,
            str(data.get("money") or data.get("amount") or ""),
        ]  # fmt: skip
        if data.get("message"):
            parts.append(str(data["message"]))
        if data.get("kind") == SaleKind.NO_SELECTION:  # the rule of every face
            parts.append(f"({NOT_A_SALE})")
        return for_terminal("  ".join(parts))  # outside words are shown, never obeyed
    return for_terminal(f"{stamp}  {kind:<10}  {data.get('text', '')}")
