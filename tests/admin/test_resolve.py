"""The admin API's view of recovery and of ATTENTION sales, and a person's resolution."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.app import load_agent
from kiosk_agent.sales.journal import SaleRecord
from kiosk_agent.sales.states import SaleState, Step
from tests.assembly.crash_driver import warm_command
from tests.helpers import walk_to
from tests.sales.test_recovery import leave_open

from .agent_thread import AgentThread, agent_thread
from .conftest import ADMIN_TOKEN, READ_TOKEN, write_config

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
READER = {"Authorization": f"Bearer {READ_TOKEN}"}


@pytest.fixture
async def api(tmp_path: Path, sim_settings: Any) -> AsyncIterator[tuple[Any, Any]]:
    """An agent whose journal holds one ATTENTION sale, ``crashed1``, and its admin API."""
    leave_open(tmp_path, state=SaleState.ATTENTION, answer_by=time.time() - 1)
    agent = load_agent(write_config(tmp_path), sim_settings, systemd=False)
    await agent.start()
    admin = next(c for c in agent.components if type(c).__name__ == "AdminServer")
    async with aiohttp.ClientSession(base_url=admin.url) as session:
        yield agent, session
    await agent.stop()


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentThread]:
    """The ``api`` fixture's agent and its ATTENTION sale, ``crashed1``, once for the resolutions
    it refuses (an agent for each of these twenty tests cost 2.6 s of CPU): a refusal changes
    nothing, so the tests sharing it leave each other the sale as they found it."""
    directory = tmp_path_factory.mktemp("refusals")
    leave_open(directory, state=SaleState.ATTENTION, answer_by=time.time() - 1)
    with agent_thread(write_config(directory)) as rig:
        yield rig


def _refused(
    rig: AgentThread, path: str, data: bytes, status: int, headers: dict[str, str] | None = None
) -> Any:
    """POST ``data`` to ``path`` as an admin: answered ``status``, and crashed1 still ATTENTION."""
    headers = {"Content-Type": "application/json", **(headers or {}), **ADMIN}
    got, answer = rig.request("AdminServer", "POST", path, body=data, headers=headers)
    assert got == status, answer
    got, shown = rig.request("AdminServer", "GET", "/api/sales/crashed1", headers=ADMIN)
    assert (got, shown["sale"]["state"]) == (200, SaleState.ATTENTION.value), shown
    return answer


async def test_status_says_when_recovery_has_finished(api: tuple[Any, Any]) -> None:
    agent, session = api
    await agent.recovery.wait()
    async with session.get("/api/status", headers=READER) as response:
        status = await response.json()
    assert status["recovery"]["state"] == "done"
    assert status["recovery"]["finished_at"] >= status["recovery"]["started_at"]
    assert status["sales"]["attention"] == 1
    assert status["attention"]["errors"] == 0


async def test_an_admin_resolves_an_attention_sale(api: tuple[Any, Any]) -> None:
    agent, session = api
    body = {"as": "reversed", "why": "refunded by hand at the machine"}
    async with session.post("/api/sales/crashed1/resolve", json=body, headers=READER) as answer:
        assert answer.status == 403  # a read token cannot decide about money
    async with session.post("/api/sales/crashed1/resolve", json=body, headers=ADMIN) as answer:
        assert answer.status == 200
        sale = (await answer.json())["sale"]
    assert sale["state"] == "reversed"
    assert sale["resolution"]["as"] == "reversed"
    assert sale["resolution"]["by"] == "admin API (ops)"
    assert sale["resolution"]["why"] == "refunded by hand at the machine"
    async with session.get("/api/sales/crashed1", headers=READER) as answer:
        shown = await answer.json()
    assert shown["sale"]["resolution"]["why"] == "refunded by hand at the machine"
    assert shown["steps"][-1]["step"] == "attention.resolved"
    assert agent.health.snapshot().sales.attention == 0
    async with session.post("/api/sales/crashed1/resolve", json=body, headers=ADMIN) as answer:
        assert answer.status == 409
        assert "not attention" in (await answer.json())["detail"]


@pytest.mark.parametrize(
    ("path", "body", "status", "detail"),
    [
        ("/api/sales/crashed1/resolve", {"as": "voided", "why": "x"}, 400, "one of captured"),
        ("/api/sales/crashed1/resolve", {"as": "reversed"}, 400, '"why"'),
        ("/api/sales/crashed1/resolve", {"as": "reversed", "why": " "}, 400, "say why"),
        ("/api/sales/crashed1/resolve", {"as": 1, "why": "x"}, 400, '"as"'),
        ("/api/sales/nope/resolve", {"as": "reversed", "why": "x"}, 404, "no sale 'nope'"),
    ],
)
def test_a_resolution_names_what_was_wrong(
    refusing: AgentThread, path: str, body: dict[str, Any], status: int, detail: str
) -> None:
    answer = _refused(refusing, path, json.dumps(body).encode(), status)
    assert detail in answer["detail"]


async def test_two_resolutions_at_once_journal_one(api: tuple[Any, Any]) -> None:
    """Two techs press Resolve at the same moment, one says captured, the other reversed."""
    agent, session = api

    async def press(as_: str) -> tuple[int, Any]:
        body = {"as": as_, "why": f"{as_} by hand"}
        async with session.post("/api/sales/crashed1/resolve", json=body, headers=ADMIN) as r:
            return r.status, await r.json()

    answers = await asyncio.gather(*(press(a) for a in ("captured", "reversed") * 4))
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200] + [409] * 7, answers
    steps = [s.step for s in agent.journal.steps("crashed1")]
    assert steps.count("attention.resolved") == 1


@pytest.mark.parametrize(
    ("path", "body", "status", "detail"),
    [
        # a LIKE-style wildcard or an empty prefix names no sale, never "the only one"
        ("/api/sales/%25/resolve", {"as": "reversed", "why": "x"}, 404, "no sale '%'"),
        ("/api/sales/_/resolve", {"as": "reversed", "why": "x"}, 404, "no sale '_'"),
        ("/api/sales/crashed%2F1/resolve", {"as": "reversed", "why": "x"}, 404, "no sale"),
        ("/api/sales/" + "c" * 5000 + "/resolve", {"as": "reversed", "why": "x"}, 404, "no sale"),
        ("/api/sales/crashed1/resolve", {"as": "CAPTURED", "why": "x"}, 400, "one of captured"),
        ("/api/sales/crashed1/resolve", {"as": "captured", "why": "x" * 501}, 400, "at most 500"),
        ("/api/sales/crashed1/resolve", {"as": "captured", "why": "\x1b[2J"}, 400, "control"),
        ("/api/sales/crashed1/resolve", {"as": "captured", "why": ["x"]}, 400, '"why"'),
        ("/api/sales/crashed1/resolve", {"as": None, "why": "x"}, 400, '"as"'),
        ("/api/sales/crashed1/resolve", [], 400, "JSON object"),
    ],
)
def test_hostile_resolutions_are_refused_by_name(
    refusing: AgentThread, path: str, body: Any, status: int, detail: str
) -> None:
    answer = _refused(refusing, path, json.dumps(body).encode(), status)
    assert detail in answer["detail"]


@pytest.mark.parametrize(
    ("data", "headers", "status"),
    [
        (b'{"as": "captured", "why": "' + b"x" * 2_000_000 + b'"}', {}, 413),
        (b'{"as": "captured", "why": "x"}', {"Content-Type": "text/plain"}, 415),
        (b"as=captured&why=x", {"Content-Type": "application/x-www-form-urlencoded"}, 415),
        (b'{"as": "captured", "why": "\xff"}', {}, 400),
        (b'{"as": "captured", "why": "\\ud800"}', {}, 400),
    ],
)
def test_hostile_resolution_bodies_get_a_clear_no(
    refusing: AgentThread, data: bytes, headers: dict[str, str], status: int
) -> None:
    answer = _refused(refusing, "/api/sales/crashed1/resolve", data, status, headers)
    assert answer["detail"]


async def test_the_cli_and_the_api_resolving_at_once_journal_one(
    api: tuple[Any, Any], tmp_path: Path
) -> None:
    """Four `kiosk-agent sales resolve` processes and four admin API requests on the same sale at
    the same moment (the agent running): exactly one resolution; every other one is told."""
    agent, session = api
    config = tmp_path / "config.yaml"

    async def cli(as_: str) -> tuple[int, str]:
        # each a process of its own, forked warm (not a cold interpreter's imports each)
        code, out, err = await warm_command(
            ["sales", "resolve", "crashed1", "--as", as_, "--why", f"{as_} by hand",
             "-c", str(config)], tmp_path,
        )  # fmt: skip
        return code, out + err

    async def press(as_: str) -> tuple[int, str]:
        body = {"as": as_, "why": f"{as_} by hand"}
        async with session.post("/api/sales/crashed1/resolve", json=body, headers=ADMIN) as r:
            return r.status, await r.text()

    answers = await asyncio.gather(
        *(cli(a) for a in ("captured", "reversed") * 2),
        *(press(a) for a in ("reversed", "captured") * 2),
    )
    won = [a for a in answers if a[0] in (0, 200)]
    assert len(won) == 1, answers
    for code, text in answers:
        if (code, text) not in won:
            assert code in (1, 409), text
            assert "not attention" in text
    steps = [s.step for s in agent.journal.steps("crashed1")]
    assert steps.count("attention.resolved") == 1


async def test_a_prefix_naming_two_sales_resolves_neither(api: tuple[Any, Any]) -> None:
    agent, session = api
    for sale_id in ("dup1aaaa", "dup2bbbb"):
        record = agent.journal.create(SaleRecord(
            sale_id=sale_id, order_id=f"KA{sale_id}", source="test", flow="charge_card",
            terminal="SIM-0001", amount_cents=100, state=SaleState.STARTED,
        ))
        walk_to(agent.journal, record, SaleState.ATTENTION, Step.CHARGE_CARD_UNKNOWN)
    body = {"as": "reversed", "why": "refunded by hand"}
    async with session.post("/api/sales/dup/resolve", json=body, headers=ADMIN) as answer:
        assert answer.status == 404
        assert "names 2 sales; give more of the sale id" in (await answer.json())["detail"]
    async with session.post("/api/sales/dup2/resolve", json=body, headers=ADMIN) as answer:
        assert answer.status == 200
        assert (await answer.json())["sale"]["sale_id"] == "dup2bbbb"
    async with session.post("/api/sales/KAdup1aaaa/resolve", json=body, headers=ADMIN) as answer:
        assert answer.status == 200  # by order id
    assert {agent.journal.get(s).state for s in ("dup1aaaa", "dup2bbbb")} == {SaleState.REVERSED}


async def test_a_resolution_from_the_cli_reaches_the_running_agent_within_a_second(
    api: tuple[Any, Any], tmp_path: Path
) -> None:
    """`kiosk-agent sales resolve` beside the running agent (as docs/journal.md shows it): the
    agent's health, metrics and event stream follow within a second. They said "1 sale(s) need
    attention" (DEGRADED, `kiosk_agent_sales_attention 1`) until the next start, while the
    page's own list of attention sales, read from the journal, said none."""
    agent, session = api
    await agent.recovery.wait()
    assert agent.health.snapshot().sales.attention == 1
    async with session.get("/metrics", headers=READER) as response:
        metrics = await response.text()
    [(cents,)] = sqlite3.connect(agent.journal.path).execute(
        "SELECT amount_cents FROM sales WHERE state = 'attention'").fetchall()
    assert f"kiosk_agent_sales_attention_cents {float(cents)}" in metrics  # the journal's price
    async with agent.events.subscribe() as steps:
        code, out, err = await warm_command(
            ["sales", "resolve", "crashed1", "--as", "reversed", "--why",
             "refunded in the portal", "-c", str(tmp_path / "config.yaml")], tmp_path,
        )  # fmt: skip
        assert code == 0, out + err
        resolved_at = time.monotonic()
        async with asyncio.timeout(5):
            event = await steps.get()
        waited = time.monotonic() - resolved_at
    assert (event.sale_id, event.step, event.state) == (
        "crashed1", Step.ATTENTION_RESOLVED, SaleState.REVERSED
    )
    assert waited < 2.0  # the look is once a second
    snapshot = agent.health.snapshot()
    assert snapshot.sales.attention == 0
    assert not any("attention" in problem for problem in snapshot.problems)
    async with session.get("/metrics", headers=READER) as response:
        metrics = await response.text()
    assert "kiosk_agent_sales_attention 0.0" in metrics
    assert "kiosk_agent_sales_attention_cents 0.0" in metrics
    async with session.get("/api/page", headers=READER) as response:
        page = await response.json()
    assert page["attention"] == []
    assert page["health"]["sales"]["attention"] == 0


async def test_a_bug_in_the_look_for_outside_resolutions_is_counted_and_the_look_goes_on(
    api: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kiosk_agent.sales.attention import OutsideResolutions

    agent, _session = api
    sweeper = agent.attention
    looks: list[int] = []
    real = agent.journal.outside_writes

    def failing_once() -> int:
        looks.append(1)
        if len(looks) == 2:  # the first look after start
            raise RuntimeError("a bug")
        return real()

    monkeypatch.setattr(agent.journal, "outside_writes", failing_once)
    watcher = OutsideResolutions(sweeper.context, on_error=sweeper._count_error)
    before = sweeper.stats.unexpected
    watcher.start()
    for _ in range(4):  # the watch of every second: the one after the bug looks again
        watcher.watch()
    watcher.stop()
    assert len(looks) == 5
    assert sweeper.stats.unexpected == before + 1
    assert "RuntimeError: a bug" in sweeper.stats.last_error
    assert agent.health.snapshot().errors.get("attention sweeper") == before + 1
