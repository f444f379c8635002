"""The sale floor (issue 33): a process that does, per kiosk API sale, the I/O the agent's sale
does and nothing of the agent's own work, so that bench/agent.py can print the agent's CPU a
sale as a ratio against it (``kiosk_sale_cpu_above_floor``), a figure the machine's speed and
load move far less than milliseconds.

    python bench/sale_floor.py --journal PATH --port PORT --base-url URL --ws-url URL

(the simulator's API key in ``BENCH_API_KEY``; prints one JSON line ``{"ready": true}`` once it
takes sales; ``--profile FILE``: cProfile on the loop thread's CPU from then until terminated,
its statistics to FILE, as bench/agent_probe.py profiles the agent, so that ``bench/agent.py
--profile`` can print the agent's profile minus the floor's). Per sale, as the agent (read off
an agent's own sales: bench/agent.py's docstring says what each part is and why it belongs
here):

- the app's ``POST /api/v1/sales`` (aiohttp server, its JSON body read) answered 202 with the
  agent's four fields (185 bytes);
- the app's WebSocket for the sale: the latest step at once, then each later one, five text
  frames of the agent's sizes (325-333 bytes), closed after the final step;
- the service: ``POST /api/terminal/{device}/charge-card`` on a kept-alive connection, its 202
  read; ``subscribe`` to the interaction on the one open cable (ActionCable WebSocket), its frames
  read until the record is no longer pending, ``unsubscribe``;
- the journal: four commits of 17 statements (5, 4, 4, 4) of the agent's shapes on the agent's
  own schema, WAL, ``synchronous=FULL``, the WAL grown ahead (the file is made and grown by the
  agent's ``Journal`` once, at the start; each sale then writes through plain sqlite3).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import signal
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

DEVICE = "SIM-0001"
AMOUNT_CENTS = 250
# The agent's text frames on a sale's WebSocket, in bytes, as an agent's sales send them: the
# latest step when the app connects (the charge asked), then accepted, approved, dispensing and
# completed. The first is sent as whichever step is latest, as the agent does.
FRAME_BYTES = {"asked": 331, "accepted": 331, "approved": 333, "dispensing": 326, "completed": 329}

# a sale is created in its flow's first commit (Journal.batch), written once in its state at the
# commit's end, with its first two steps in one INSERT (2026-11-29, i39-window-journal)
_INSERT_SALE = (
    "INSERT INTO sales (sale_id, order_id, source, flow, terminal, amount_cents, state, product, "
    "currency, attempt, interaction_id, interaction_kind, trans_id, authorized_cents, "
    "vended_cents, captured_cents, reversed_cents, reverse_trans_id, card_brand, last_four, "
    "vault_uuid, plan_id, message, created_at, updated_at, finished_at, answer_by, resolution) "
    "VALUES (?, ?, 'kiosk_api:screen', 'charge_card', ?, ?, 'charging', 'coffee', 'USD', 1, "
    "NULL, NULL, NULL, 0, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, ?, ?, ?, NULL, ?, NULL)"
)
_INSERT_STEP = "INSERT INTO steps (sale_id, at, step, state, detail) VALUES (?, ?, ?, ?, ?)"
_INSERT_TWO_STEPS = _INSERT_STEP + ", (?, ?, ?, ?, ?)"
_INSERT_SEND = (
    "INSERT INTO sale_sends (sale_id, sent_at, sent_mono, sent_boot) VALUES (?, ?, ?, ?) "
    "ON CONFLICT(sale_id) DO UPDATE SET sent_at = excluded.sent_at, "
    "sent_mono = excluded.sent_mono, sent_boot = excluded.sent_boot"
)
_ACCEPTED = (
    "UPDATE sales SET interaction_id = ?, interaction_kind = 'charge_card', "
    "updated_at = ? WHERE sale_id = ? AND state = 'charging'"
)
_APPROVED = (  # with the dispense request (a batch's steps of one sale: one UPDATE)
    "UPDATE sales SET trans_id = ?, authorized_cents = ?, captured_cents = ?, "
    "updated_at = ?, message = ?, state = 'dispensing' WHERE sale_id = ? AND state = 'charging'"
)
_COMPLETED = (
    "UPDATE sales SET vended_cents = ?, message = ?, finished_at = ?, state = 'completed', "
    "updated_at = ? WHERE sale_id = ? AND state = 'dispensing'"
)
BOOT_ID = str(uuid.uuid4())


def commit(db: sqlite3.Connection, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
    """One journal transaction, as the agent's batch: BEGIN IMMEDIATE, the writes, COMMIT."""
    db.execute("BEGIN IMMEDIATE")
    for sql, values in statements:
        db.execute(sql, values)
    db.execute("COMMIT")


def frame(sale_id: str, order_id: str, step: str, final: bool) -> str:
    """A text frame of the agent's size for ``step``, with what the app's driver reads."""
    state = {"approved": "charging", "asked": "charging", "accepted": "charging"}.get(step, step)
    body = {"sale_id": sale_id, "order_id": order_id, "state": state, "final": final,
            "amount": "2.50", "amount_cents": AMOUNT_CENTS, "step": step, "pad": ""}
    text = json.dumps(body)
    body["pad"] = " " * max(0, FRAME_BYTES[step] - len(text))
    return json.dumps(body)


class Cable:
    """The service's one ActionCable WebSocket, opened once; frames sent to their subscriber."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.subscribers: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for message in self.ws:
            data = json.loads(message.data)
            queue = self.subscribers.get(data.get("identifier", ""))
            if queue is not None and "message" in data:
                queue.put_nowait(data["message"])

    async def final_record(self, interaction_id: str) -> dict[str, Any]:
        """Subscribe to the interaction, read its records until one is no longer pending, and
        unsubscribe."""
        identifier = json.dumps({"channel": f"terminal_job:{interaction_id}"})
        queue = self.subscribers[identifier] = asyncio.Queue()
        await self.ws.send_str(json.dumps({"command": "subscribe", "identifier": identifier}))
        try:
            while (record := await queue.get())["status"] == "pending":
                pass
        finally:
            del self.subscribers[identifier]
            await self.ws.send_str(json.dumps({"command": "unsubscribe", "identifier": identifier}))
        return record


class FloorJournal:
    """A sale's four commits: the agent's statements' shapes, through plain sqlite3."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def asked(self, sale_id: str, order_id: str) -> None:
        now = time.time()
        commit(self.db, [
            (_INSERT_SALE, (sale_id, order_id, DEVICE, AMOUNT_CENTS,
                            "asking for $2.50 on SIM-0001", now, now, now + 25)),
            (_INSERT_SEND, (sale_id, now, time.monotonic(), BOOT_ID)),
            (_INSERT_TWO_STEPS, (
                sale_id, now, "created", "started",
                json.dumps({"product": "coffee", "source": "kiosk_api:screen"}),
                sale_id, now, "charge_card.request", "charging",
                json.dumps({"amount_cents": AMOUNT_CENTS, "order_id": order_id}))),
        ])  # fmt: skip

    def accepted(self, sale_id: str, interaction_id: str) -> None:
        now = time.time()
        commit(self.db, [
            (_ACCEPTED, (interaction_id, now, sale_id)),
            (_INSERT_STEP, (sale_id, now, "charge_card.accepted", "charging", "{}")),
        ])  # fmt: skip

    def approved(self, sale_id: str, trans_id: str | None) -> None:
        now = time.time()
        commit(self.db, [
            (_APPROVED, (trans_id, AMOUNT_CENTS, AMOUNT_CENTS, now, "vending up to $2.50",
                         sale_id)),
            (_INSERT_TWO_STEPS, (sale_id, now, "charge_card.approved", "charging",
                                 json.dumps({"trans_id": trans_id}),
                                 sale_id, now, "dispense.request", "dispensing", "{}")),
        ])  # fmt: skip

    def completed(self, sale_id: str) -> None:
        now = time.time()
        commit(self.db, [
            (_COMPLETED, (AMOUNT_CENTS, "paid $2.50 and dispensed", now, now, sale_id)),
            (_INSERT_STEP, (sale_id, now, "completed", "completed", json.dumps(
                {"detail": "paid", "product": "coffee", "status": "vended",
                 "vended_cents": AMOUNT_CENTS}))),
        ])  # fmt: skip

    def one_sale(self) -> None:
        """A sale's commits with no I/O between them (tests/test_bench.py reads their shapes)."""
        sale_id, order_id = new_ids()
        self.asked(sale_id, order_id)
        self.accepted(sale_id, str(uuid.uuid4()))
        self.approved(sale_id, "700000000001")
        self.completed(sale_id)


def new_ids() -> tuple[str, str]:
    """A sale id and an order id of the agent's lengths."""
    sale_id = uuid.uuid4().hex
    unit, tail = uuid.uuid4().hex[:10].upper(), uuid.uuid4().hex[:8].upper()
    return sale_id, f"KA{unit}-{sale_id[:16].upper()}{tail}"


class Floor:
    """The app's side (an aiohttp server) and the service's (a client and the cable) of a sale,
    around its journal's commits."""

    def __init__(self, journal: FloorJournal, http: aiohttp.ClientSession, cable: Cable,
                 base_url: str, api_key: str) -> None:
        self.journal, self.http, self.cable = journal, http, cable
        self.charge_url = f"{base_url}/api/terminal/{DEVICE}/charge-card"
        self.auth = {"Authorization": f"Bearer {api_key}"}
        self.latest: dict[str, str] = {}
        self.followers: dict[str, asyncio.Queue[str]] = {}
        self.sales: set[asyncio.Task[None]] = set()

    def publish(self, sale_id: str, text: str) -> None:
        self.latest[sale_id] = text
        follower = self.followers.get(sale_id)
        if follower is not None:
            follower.put_nowait(text)

    async def start_sale(self, request: web.Request) -> web.Response:
        await request.json()
        sale_id, order_id = new_ids()
        self.journal.asked(sale_id, order_id)
        self.publish(sale_id, frame(sale_id, order_id, "asked", False))
        sale = asyncio.ensure_future(self.charge_or_fail(sale_id, order_id))
        self.sales.add(sale)
        sale.add_done_callback(self.sales.discard)
        return web.json_response(
            {"sale_id": sale_id, "order_id": order_id, "amount": "2.50",
             "events": f"/api/v1/sales/{sale_id}/events"},
            status=202,
        )  # fmt: skip

    async def charge_or_fail(self, sale_id: str, order_id: str) -> None:
        """The sale's charge; what goes wrong ends it with a final frame that says so (the
        driver stops on it and shows it, instead of waiting on the WebSocket)."""
        try:
            await self.charge(sale_id, order_id)
        except Exception as exc:  # told to the driver, which fails the bench with it
            failed = {"sale_id": sale_id, "state": "failed", "final": True, "error": repr(exc)}
            self.publish(sale_id, json.dumps(failed))

    async def charge(self, sale_id: str, order_id: str) -> None:
        body = {"amount": AMOUNT_CENTS, "order_id": order_id}
        async with self.http.post(self.charge_url, json=body, headers=self.auth) as response:
            interaction_id = (await response.json())["interaction_id"]
        self.journal.accepted(sale_id, interaction_id)
        self.publish(sale_id, frame(sale_id, order_id, "accepted", False))
        record = await self.cable.final_record(interaction_id)
        self.journal.approved(sale_id, (record.get("result") or {}).get("trans_id"))
        self.publish(sale_id, frame(sale_id, order_id, "approved", False))
        self.publish(sale_id, frame(sale_id, order_id, "dispensing", False))
        self.journal.completed(sale_id)
        self.publish(sale_id, frame(sale_id, order_id, "completed", True))

    async def events(self, request: web.Request) -> web.WebSocketResponse:
        sale_id = request.match_info["sale_id"]
        ws = web.WebSocketResponse(heartbeat=15.0, compress=False)  # as the agent's
        await ws.prepare(request)
        follower = self.followers[sale_id] = asyncio.Queue()
        try:
            text = self.latest.get(sale_id)
            while text is not None:
                await ws.send_str(text)
                if '"final": true' in text:
                    break
                text = await follower.get()
        finally:
            del self.followers[sale_id]
            self.latest.pop(sale_id, None)
            await ws.close()
        return ws


async def open_cable(http: aiohttp.ClientSession, base_url: str, ws_url: str,
                     api_key: str) -> Cable:
    """The cable as the agent opens it: a WebSocket token, the handshake, the welcome."""
    auth = {"Authorization": f"Bearer {api_key}"}
    async with http.post(f"{base_url}/api/ws-token", headers=auth) as response:
        token = (await response.json())["token"]
    ws = await http.ws_connect(f"{ws_url}/cable", params={"token": token},
                               protocols=("actioncable-v1-json",), autoping=True, heartbeat=None)
    while json.loads((await ws.receive()).data).get("type") != "welcome":
        pass
    return Cable(ws)


def open_journal(path: Path) -> sqlite3.Connection:
    """The agent's journal file, made and grown ahead by the agent's own ``Journal`` (its schema
    and pragmas, in this process's connection): a sale's writes then go through plain sqlite3."""
    from kiosk_agent.sales.journal import Journal

    journal = Journal(path)
    journal.open()
    journal.reserve_wal()
    return journal.db


async def main() -> None:
    # run as the agent is (the unit's PYTHONOPTIMIZE=2 drops docstrings)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--ws-url", required=True)
    parser.add_argument("--profile", type=Path, default=None, metavar="FILE")
    args = parser.parse_args()
    api_key = os.environ["BENCH_API_KEY"]
    db = open_journal(args.journal)
    async with aiohttp.ClientSession() as http:
        cable = await open_cable(http, args.base_url, args.ws_url, api_key)
        floor = Floor(FloorJournal(db), http, cable, args.base_url, api_key)
        app = web.Application()
        app.router.add_post("/api/v1/sales", floor.start_sale)
        app.router.add_get("/api/v1/sales/{sale_id}/events", floor.events)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", args.port).start()
        if args.profile:
            profile_until_terminated(args.profile)
        print(json.dumps({"ready": True}), flush=True)
        try:
            await asyncio.Event().wait()  # until terminated
        finally:
            await runner.cleanup()
            await cable.ws.close()


def profile_until_terminated(path: Path) -> None:
    """cProfile on the loop thread's CPU, as the agent's; at SIGTERM its statistics to ``path``,
    and the process ends at once, as SIGTERM ends it unprofiled (no cleanup waits on a stream
    whose driver is gone)."""
    profiler = cProfile.Profile(time.thread_time)

    def dump_and_end() -> None:
        profiler.disable()
        profiler.dump_stats(path)
        os._exit(0)

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, dump_and_end)
    profiler.enable()


if __name__ == "__main__":
    asyncio.run(main())
