"""Sale time when the service is rate-limited, slow, drops its WebSocket, or goes silent.

    python bench/adverse.py [--sales 20] [--time-scale 5] [--timeout T]

The agent runs two virtual vending machines (the ``mdb`` platform on two virtual controllers,
authorize_capture on SIM-0001 and SIM-0002) against ``kiosk-agent sim`` in its own process, with
the simulator's and the client's default rate limits (20/s). Each condition is switched on through
the simulator's fault injection (``/sim/faults``) and both machines sell ``--sales`` times:

1. plain;
2. a 429 (``Retry-After: 1``) on the first status poll of each interaction;
3. +100 ms on every request;
4. the WebSocket dropped right after each ``confirm_subscription``;
5. all of 2-4 together.

A sale's time runs from its first event to its end on the agent's event bus (card, authorization,
vend and capture). For each condition: median and p99 sale time, the ratio of the median to the
plain one, and the requests a sale made (the simulator's count). After condition 2 the fault is
deleted and each machine sells ten more times: the tenth is compared with plain.

Then the service becomes a black hole (every call accepted, never answered): the time for
``kiosk-agent terminals`` (its own process, default timeout) and for one sale to end. Last, only
the money calls meet a black hole, at once on both terminals: the authorization (``POST
/api/v1/charge``, an authorize_capture on SIM-0001) and the charge-card start (charge_card on
SIM-0002). Each sale's end is timed from the journaled step that sent the call and printed next
to its documented bound (``SaleSettings.silence_bound``: 2T + M, + 1.1 L for a charge-card; the
table in docs/architecture.md), with whether reporting shows money held for it.

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from kiosk_agent.app import build_agent
from kiosk_agent.assembly.agent import Agent
from kiosk_agent.cli.sim import parse_ready, settings_from_ready
from kiosk_agent.config.load import load_config
from kiosk_agent.sales.model import DispenseOutcome, DispenseStatus, Flow, SaleEvent, SaleRequest
from kiosk_agent.sales.states import Step
from kiosk_agent.service.models import TransactionFilter, TransStatus
from kiosk_agent.service.settings import ServiceSettings
from kiosk_agent.sim.machine import ControllerOptions, VirtualController

PRODUCTS = {"A1": 150, "A2": 250, "B1": 325}
MACHINES = ("SIM-0001", "SIM-0002")
LATENCY_S = 0.1
RETRY_AFTER_S = 1
FIRST_POLL = {"fault": "first_poll_rate_limited", "retry_after_s": RETRY_AFTER_S}
LATENCY = {"path": "/*", "method": "*", "fault": "latency", "delay_s": LATENCY_S}
WS_DROP = {"fault": "ws_drop_after_confirm", "share": 1}
BLACK_HOLE = {"path": "/*", "method": "*", "fault": "black_hole", "share": 1}
# Only the money call of each flow meets a black hole: (terminal, flow, the sending step, fault).
MONEY_BLACK_HOLES = (
    ("SIM-0001", Flow.AUTHORIZE_CAPTURE, Step.AUTHORIZE_REQUEST, "/api/v1/charge"),
    ("SIM-0002", Flow.CHARGE_CARD, Step.CHARGE_CARD_REQUEST, "/api/terminal/SIM-0002/charge-card"),
)
HELD = frozenset({TransStatus.AUTHORIZED, TransStatus.CAPTURED, TransStatus.SETTLED})
CONDITIONS: dict[str, list[dict[str, Any]]] = {
    "plain": [],
    "first_poll_429": [FIRST_POLL],
    "latency_100ms": [LATENCY],
    "ws_drop": [WS_DROP],
    "all": [FIRST_POLL, LATENCY, WS_DROP],
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class Sim:
    """``kiosk-agent sim`` in its own process, and its test helpers over HTTP."""

    def __init__(self, time_scale: float) -> None:
        self.time_scale = time_scale
        self.process: asyncio.subprocess.Process | None = None
        self.info: dict[str, Any] = {}
        self.http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kiosk_agent", "sim", "--port", "0",
            "--time-scale", str(self.time_scale), "--transactions", "0",
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert self.process.stdout is not None
        async with asyncio.timeout(30):
            while (info := parse_ready((await self.process.stdout.readline()).decode())) is None:
                pass
        self.info = info
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.close()
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            await self.process.wait()

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        assert self.http is not None
        url = f"{self.info['base_url']}{path}"
        async with self.http.request(method, url, json=body) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.json()

    async def faults(self, faults: list[dict[str, Any]]) -> None:
        await self.call("DELETE", "/sim/faults")
        for fault in faults:
            await self.call("POST", "/sim/faults", fault)

    async def requests(self) -> int:
        return int((await self.call("GET", "/sim/stats"))["requests"])


class Rig:
    """The agent with two virtual machines, and each sale's time from the event bus."""

    def __init__(self, sim: Sim, scratch: Path, timeout: float | None) -> None:
        self.sim = sim
        self.scratch = scratch
        self.timeout = timeout
        self.controllers = [
            VirtualController(ControllerOptions(products=PRODUCTS, dispense_time=0.0))
            for _ in MACHINES
        ]
        self.agent: Agent | None = None
        self.began: dict[str, float] = {}
        self.ended: dict[str, SaleEvent] = {}
        self.ended_at: dict[str, float] = {}
        self._watch: asyncio.Task[None] | None = None

    def settings(self) -> ServiceSettings:
        tuning = {"timeout": self.timeout} if self.timeout else {}
        return settings_from_ready(self.sim.info, **tuning)

    async def start(self) -> None:
        for controller in self.controllers:
            await controller.start()
        document = {
            "service": {"simulator": {"time_scale": self.sim.time_scale}},
            "terminals": [{"device_id": device} for device in MACHINES],
            "journal": {"path": str(self.scratch / "journal.db")},
            "receipts": {"print": "never", "email": False},
            "logging": {"level": "ERROR"},
            "triggers": [
                {"platform": "mdb", "name": f"machine{n}", "port": controller.port,
                 "terminal": device, "flow": "authorize_capture"}
                for n, (device, controller)
                in enumerate(zip(MACHINES, self.controllers, strict=True))
            ],
        }  # fmt: skip
        path = self.scratch / "adverse.yaml"
        path.write_text(yaml.safe_dump(document))
        self.agent = build_agent(load_config(path), self.settings(), systemd=False)
        await self.agent.start()
        self._watch = asyncio.create_task(self._follow())
        for controller in self.controllers:
            await asyncio.wait_for(controller.wait_enabled(), 10)

    async def _follow(self) -> None:
        assert self.agent is not None
        async with self.agent.events.subscribe() as queue:
            while True:
                event = await queue.get()
                now = time.monotonic()
                self.began.setdefault(event.sale_id, now)
                if event.state.final and not event.receipt and event.sale_id not in self.ended:
                    self.ended[event.sale_id] = event
                    self.ended_at[event.sale_id] = now

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self.agent is not None:
            await self.agent.stop()
        for controller in self.controllers:
            await controller.stop()

    async def sell(self, per_machine: int) -> list[tuple[float, SaleEvent]]:
        """Both machines sell ``per_machine`` times in parallel; (seconds, end) per sale, in
        the order they ended."""
        known = set(self.ended)

        async def machine(controller: VirtualController, offset: int) -> None:
            products = sorted(PRODUCTS)
            for n in range(per_machine):
                await controller.customer(products[(n + offset) % len(products)])
                await self._settled()

        await asyncio.gather(*(machine(c, n) for n, c in enumerate(self.controllers)))
        await self._settled()
        new = sorted((s for s in self.ended if s not in known), key=self.ended_at.__getitem__)
        return [(self.ended_at[s] - self.began[s], self.ended[s]) for s in new]

    async def _settled(self) -> None:
        """Until every sale begun has ended (the capture follows the vend)."""
        async with asyncio.timeout(120):
            while set(self.began) - set(self.ended):  # noqa: ASYNC110 (a bench's poll)
                await asyncio.sleep(0.002)


async def run_condition(
    rig: Rig, sim: Sim, name: str, faults: list[dict[str, Any]], sales: int
) -> dict[str, Any]:
    await sim.faults(faults)
    before = await sim.requests()
    assert rig.agent is not None
    transport = rig.agent.service.transport
    heard = transport.rate_limited_count
    ended = await rig.sell(sales)
    requests = await sim.requests() - before
    times = [seconds for seconds, _ in ended]
    states: dict[str, int] = {}
    for _, event in ended:
        states[event.state.value] = states.get(event.state.value, 0) + 1
    figures: dict[str, Any] = {
        f"{name}_median_s": round(statistics.median(times), 3),
        f"{name}_p99_s": round(percentile(times, 99), 3),
        f"{name}_requests_per_sale": round(requests / len(times), 2),
        f"{name}_sales": len(times),
        f"{name}_429s": transport.rate_limited_count - heard,
    }
    if set(states) != {"completed"}:
        figures[f"{name}_states"] = states
    return figures


async def after_the_429s(rig: Rig, sim: Sim) -> float:
    """The faults deleted, ten more sales per machine: the time of the tenth."""
    await sim.faults([])
    ended = await rig.sell(10)
    print("  after the 429s:", " ".join(f"{seconds:.3f}" for seconds, _ in ended))
    return round(ended[-1][0], 3)


async def terminals_against_black_hole(sim: Sim) -> float:
    env = {
        **os.environ,
        "KIOSK_BASE_URL": sim.info["base_url"],
        "KIOSK_API_KEY": sim.info["api_key"],
        "KIOSK_MID": sim.info["mid"],
    }
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kiosk_agent", "terminals", env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await process.communicate()
    took = time.monotonic() - started
    print(f"  `terminals` exit {process.returncode}: {stderr.decode().strip()[:160]}")
    return round(took, 2)


class Machine:
    """A machine for a sale started directly: it vends whatever it is allowed, and says no."""

    def __init__(self) -> None:
        self.vended = 0
        self.denied: list[str] = []

    async def dispense(self, authorized_cents: int) -> DispenseOutcome:
        self.vended += 1
        return DispenseOutcome(DispenseStatus.VENDED, vended_cents=authorized_cents)

    async def deny(self, reason: str) -> None:
        self.denied.append(reason)


async def money_calls_against_black_hole(rig: Rig, sim: Sim) -> dict[str, Any]:
    """An authorization and a charge-card start meet a black hole, both at once."""
    agent = rig.agent
    assert agent is not None
    await sim.faults([{"path": path, "fault": "black_hole"} for *_, path in MONEY_BLACK_HOLES])

    async def one(device: str, flow: Flow, sending: str) -> dict[str, Any]:
        machine = Machine()
        request = SaleRequest(source="bench", flow=flow, amount_cents=150, terminal=device)
        sale = await agent.sales.start(request, machine)
        event = await sale.result()
        record = agent.journal.get(sale.sale_id)
        assert record is not None
        assert record.finished_at is not None
        [sent] = [s.at for s in agent.journal.steps(sale.sale_id) if s.step == sending]
        rows = [t async for t in agent.service.reporting.transactions(
            TransactionFilter(order_id=sale.order_id))]  # fmt: skip
        name = "authorization" if flow is Flow.AUTHORIZE_CAPTURE else "charge_card_start"
        return {
            f"black_hole_{name}_end_s": round(record.finished_at - sent, 2),
            f"black_hole_{name}_bound_s": round(agent.settings.silence_bound(flow), 2),
            f"black_hole_{name}_state": f"{event.state.value} {event.step}",
            f"black_hole_{name}_held_rows": sum(1 for row in rows if row.status in HELD),
            f"black_hole_{name}_vended": machine.vended,
            f"black_hole_{name}_denied": len(machine.denied),
        }

    results = await asyncio.gather(*(one(d, f, step) for d, f, step, _ in MONEY_BLACK_HOLES))
    await sim.faults([])
    figures = {key: value for result in results for key, value in result.items()}
    figures["answer_margin_s"] = agent.settings.answer_margin
    figures["interaction_lifetime_s"] = round(agent.settings.interaction_lifetime, 3)
    for name in ("authorization", "charge_card_start"):
        print(
            f"  black hole at the {name.replace('_', ' ')}: ended "
            f"{figures[f'black_hole_{name}_end_s']} s after the send, bound "
            f"{figures[f'black_hole_{name}_bound_s']} s ({figures[f'black_hole_{name}_state']}; "
            f"held rows {figures[f'black_hole_{name}_held_rows']}, vended "
            f"{figures[f'black_hole_{name}_vended']})"
        )
    return figures


async def main(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    sim = Sim(args.time_scale)
    await sim.start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-adverse-") as scratch:
            rig = Rig(sim, Path(scratch), args.timeout)
            await rig.start()
            try:
                await rig.sell(2)  # warm up: OAuth token, sessions, journal
                for name, faults in CONDITIONS.items():
                    figures |= await run_condition(rig, sim, name, faults, args.sales)
                    if name == "first_poll_429":
                        figures["tenth_sale_after_429s_s"] = await after_the_429s(rig, sim)
                    report(figures, name)
                figures["timeout_s"] = rig.settings().timeout
                figures["cli_timeout_s"] = ServiceSettings(base_url="http://cli").timeout
                await sim.faults([BLACK_HOLE])
                figures["black_hole_terminals_s"] = await terminals_against_black_hole(sim)
                started = time.monotonic()
                ended = await rig.sell(1)
                figures["black_hole_sale_s"] = round(time.monotonic() - started, 2)
                figures["black_hole_sale_ends"] = sorted({e.step for _, e in ended})
                await sim.faults([])
                figures |= await money_calls_against_black_hole(rig, sim)
            finally:
                await rig.stop()
    finally:
        await sim.stop()
    plain = figures["plain_median_s"]
    for name in CONDITIONS:
        figures[f"{name}_ratio"] = round(figures[f"{name}_median_s"] / plain, 2)
    figures["tenth_sale_after_429s_ratio"] = round(figures["tenth_sale_after_429s_s"] / plain, 2)
    return figures


def report(figures: dict[str, Any], name: str) -> None:
    print(
        f"{name:16} median {figures[f'{name}_median_s']:.3f} s  "
        f"p99 {figures[f'{name}_p99_s']:.3f} s"
        f"  requests/sale {figures[f'{name}_requests_per_sale']}  sales {figures[f'{name}_sales']}"
        f"  429s {figures[f'{name}_429s']}"
        + (f"  {figures[f'{name}_states']}" if f"{name}_states" in figures else "")
    )


def verdicts(figures: dict[str, Any]) -> None:
    plain = figures["plain_median_s"]
    timeout = figures["timeout_s"]
    checks = [
        ("first_poll_429 median <= plain + 1.1 s", figures["first_poll_429_median_s"],
         plain + 1.1),
        ("tenth sale after the 429s <= 1.2 x plain", figures["tenth_sale_after_429s_s"],
         1.2 * plain),
        ("latency_100ms median <= plain + 10 x 100 ms", figures["latency_100ms_median_s"],
         plain + 10 * LATENCY_S),
        ("black hole: terminals <= timeout + 1 s", figures["black_hole_terminals_s"],
         figures["cli_timeout_s"] + 1),
        ("black hole: a sale ends <= timeout + 1 s (read-card start)",
         figures["black_hole_sale_s"], timeout + 1),
        ("black hole at the authorization: ends <= 2T + M",
         figures["black_hole_authorization_end_s"], figures["black_hole_authorization_bound_s"]),
        ("black hole at the charge-card start: ends <= 2T + M + 1.1 L",
         figures["black_hole_charge_card_start_end_s"],
         figures["black_hole_charge_card_start_bound_s"]),
    ]  # fmt: skip
    print()
    for name in CONDITIONS:
        print(f"{name:16} ratio to plain {figures[f'{name}_ratio']}")
    print(f"tenth sale after the 429s stop: {figures['tenth_sale_after_429s_s']} s "
          f"({figures['tenth_sale_after_429s_ratio']} x plain)")
    print(f"black hole: `terminals` {figures['black_hole_terminals_s']} s, one sale "
          f"{figures['black_hole_sale_s']} s ({', '.join(figures['black_hole_sale_ends'])}); "
          f"agent timeout {timeout:g} s")
    for label, value, limit in checks:
        print(f"  {label}: {value} vs {limit:.3f}  {'ok' if value <= limit else 'MISSED'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sales", type=int, default=20, help="sales per machine per condition")
    parser.add_argument("--time-scale", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=None,
                        help="the agent's service timeout (default: the client's)")
    result = asyncio.run(main(parser.parse_args()))
    verdicts(result)
    print(json.dumps(result))
