"""Every time in the JSON of every face is ISO 8601 UTC to the second (``2026-11-28T21:47:03Z``):
the admin API's answers and each command's ``--json``, read from a real agent on the simulator
and its journal. A Unix-seconds timestamp, a local time or a display text in JSON fails here."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.app import load_agent
from kiosk_agent.sales.states import SaleState
from tests.cli.test_contract import run
from tests.helpers import ISO_UTC
from tests.helpers import json_time_problems as problems
from tests.sales.test_recovery import leave_open

from .conftest import ADMIN_TOKEN, READ_TOKEN, write_config


def test_the_walk_finds_every_kind_of_time_that_is_not_iso() -> None:
    found = list(problems({
        "created_at": 1795903257.6, "ok_at": "2026-11-28T21:47:03Z", "none_at": None,
        "since": "2026-11-28 21:47:03Z", "nested": [{"when": 1795903257}],
        "local": "2026-11-28T22:47:03+01:00", "text": "at 2026-11-28T21:47:03Z: fine",
        "count": 12, "cents": 250, "flag": True,
    }))
    assert found == [
        ".created_at = 1795903257.6: a time as a number",
        ".created_at = 1795903257.6: Unix seconds",
        ".since = '2026-11-28 21:47:03Z': not ISO 8601 UTC",
        ".nested[0].when = 1795903257: Unix seconds",
        ".local = '2026-11-28T22:47:03+01:00': not ISO 8601 UTC",
    ]


@pytest.fixture
async def unit(tmp_path: Path, sim_settings: Any) -> AsyncIterator[tuple[Path, str]]:
    """A running agent whose journal holds a sale a crash left in attention (with its answer
    deadline), resolved by a person: every time a sale can carry. (config, admin API URL)."""
    leave_open(tmp_path, state=SaleState.ATTENTION, answer_by=time.time() - 1)
    config = write_config(tmp_path)
    agent = load_agent(config, sim_settings, systemd=False)
    await agent.start()
    admin = next(c for c in agent.components if type(c).__name__ == "AdminServer")
    await agent.recovery.wait()
    resolution = {"as": "reversed", "why": "refunded at the machine"}
    async with (
        aiohttp.ClientSession(base_url=admin.url) as session,
        session.post("/api/sales/crashed1/resolve", json=resolution,
                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as answer,
    ):
        assert answer.status == 200
    yield config, admin.url
    await agent.stop()


async def test_every_time_in_the_admin_apis_json_is_iso_8601_utc(
    unit: tuple[Path, str],
) -> None:
    _config, url = unit
    found: dict[str, list[str]] = {}
    async with aiohttp.ClientSession(
        base_url=url, headers={"Authorization": f"Bearer {READ_TOKEN}"}
    ) as session:
        for path in ("/api/health", "/api/status", "/api/sales", "/api/sales/crashed1",
                     "/api/terminals", "/api/reports/transactions?since=7d",
                     "/api/reports/transactions?since=today&format=json",
                     "/api/sales?format=json"):
            async with session.get(path) as answer:
                assert answer.status == 200, path
                document = await answer.json()
            found[path] = list(problems(document))
    assert document[0]["created"].endswith("Z")  # the export: its own column names
    assert found == {key: [] for key in found}, found


async def test_every_time_in_each_commands_json_is_iso_8601_utc(
    unit: tuple[Path, str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import json

    config, url = unit
    monkeypatch.setenv("KIOSK_AGENT_TOKEN", READ_TOKEN)
    found: dict[str, list[str]] = {}
    for argv in (["sales"], ["sales", "attention"], ["sales", "show", "crashed1"],
                 ["unit", "show"], ["audit"], ["health", "--url", url]):
        code, out, err = await run(capsys, [*argv, "-c", str(config), "--json"])
        assert code in (0, 1), (argv, err)
        found[" ".join(argv[:2])] = list(problems(json.loads(out)))
    assert found == {key: [] for key in found}, found


async def test_unit_show_gives_json_null_and_raw_values_not_display_text(
    unit: tuple[Path, str], capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    config, _url = unit
    code, out, _err = await run(capsys, ["unit", "show", "-c", str(config), "--json"])
    assert code == 0
    shown = json.loads(out)
    assert shown["mismatch"] is None
    assert shown["former_ids"] == []
    assert ISO_UTC.fullmatch(shown["made_at"])
    code, out, _err = await run(capsys, ["unit", "show", "-c", str(config)])
    assert "mismatch      -" in out  # for people: the placeholder, the time with a space
    assert re.search(r"made_at\s+\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}Z", out), out


async def test_health_watch_prints_the_streams_snapshots_with_the_times_health_json_has(
    unit: tuple[Path, str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio
    import json

    _config, url = unit
    monkeypatch.setenv("KIOSK_AGENT_TOKEN", READ_TOKEN)
    watching = asyncio.ensure_future(run(capsys, ["health", "--watch", "--url", url, "--json"]))
    printed = ""
    for _ in range(200):  # the first snapshot comes as the stream opens
        await asyncio.sleep(0.05)
        printed += capsys.readouterr().out
        if printed.endswith("\n"):
            break
    watching.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watching
    snapshot = json.loads(printed.splitlines()[0])
    assert ISO_UTC.fullmatch(snapshot["at"])
    assert list(problems(snapshot)) == []


def test_a_stream_event_printed_in_json_has_its_times_in_iso_8601() -> None:
    from kiosk_agent.export import stream_json

    event = {"kind": "sale", "at": 1795866930.4, "sale_id": "s1", "amount": "2.50",
             "health": {"started_at": 1795866000, "terminals": [{"last_ping_at": None,
                                                                  "latency_ms": 12.5}]}}
    shown = stream_json(event)
    assert shown == {"kind": "sale", "at": "2026-11-28T11:55:30Z", "sale_id": "s1",
                     "amount": "2.50", "health": {"started_at": "2026-11-28T11:40:00Z",
                                                  "terminals": [{"last_ping_at": None,
                                                                 "latency_ms": 12.5}]}}
    assert list(problems(shown)) == []


async def test_a_sales_time_reads_the_same_in_the_list_and_in_show_and_iso_in_json(
    unit: tuple[Path, str], capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    config, _url = unit
    _code, listed, _err = await run(capsys, ["sales", "-c", str(config)])
    _code, shown, _err = await run(capsys, ["sales", "show", "crashed1", "-c", str(config)])
    _code, as_json, _err = await run(capsys, ["sales", "show", "crashed1", "-c", str(config),
                                              "--json"])
    created = json.loads(as_json)["sale"]["created_at"]  # 2026-11-28T21:47:03Z
    for_people = created.replace("T", " ")  # 2026-11-28 21:47:03Z, as every table
    assert listed.splitlines()[1].startswith(for_people + "  "), listed
    assert re.search(rf"^created\s+{for_people}$", shown, re.MULTILINE), shown
