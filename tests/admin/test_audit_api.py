"""GET /api/audit: the machine's books as `kiosk-agent audit --format json|csv` writes them."""

from __future__ import annotations

import csv
import io
from typing import Any

from kiosk_agent.audit.component import AuditReads, Port
from kiosk_agent.export import export_audit
from tests.audit.helpers import figures


async def test_without_a_dex_section_it_says_so(api: Any, read_headers: dict[str, str]) -> None:
    async with api.get("/api/audit", headers=read_headers) as resp:
        assert resp.status == 404
        assert (await resp.json())["error"] == "no_audit"


async def test_the_books_in_json_and_csv_are_the_one_export(
    agent: Any, api: Any, read_headers: dict[str, str]
) -> None:
    answers = [figures((2, 300), columns={"A1": (150, 2, 2)}),
               figures((4, 600), columns={"A1": (150, 4, 4)})]

    async def read_file() -> bytes:
        return b"an audit file"

    port = Port(read_file, lambda _: answers.pop(0))  # each read: the next figures
    books = AuditReads(agent, {"trigger": "lobby", "planogram": {"A1": 5}, "low_stock": 1}, port)
    await books.start()
    agent.components.append(books)
    await books.read_once()
    await books.read_once()
    async with api.get("/api/audit", headers=read_headers) as resp:
        assert resp.status == 200
        document = await resp.json()
    assert document["columns"][0]["estimate"] == 3  # sold 2 since the first read, of 5
    assert document["comparisons"][0]["verdict"] == "mismatch"  # 2 card vends, no sale
    async with api.get("/api/audit?format=csv", headers=read_headers) as resp:
        body = await resp.text()
    assert body == "".join(export_audit(books.report(), "csv"))
    [row] = csv.DictReader(io.StringIO(body))
    assert (row["column"], row["price"], row["estimate"]) == ("A1", "1.50", "3")
    async with api.get("/api/audit?format=xml", headers=read_headers) as resp:
        assert resp.status == 400
        assert "format must be csv or json" in (await resp.json())["detail"]


async def test_since_picks_the_intervals_as_the_command_line_does(
    agent: Any, api: Any, read_headers: dict[str, str]
) -> None:
    answers = [figures((2, 300)), figures((4, 600)), figures((4, 600))]

    async def read_file() -> bytes:
        return b"an audit file"

    books = AuditReads(agent, {"trigger": "lobby"}, Port(read_file, lambda _: answers.pop(0)))
    await books.start()
    agent.components.append(books)
    for _ in answers[:]:
        await books.read_once()
    stored = books.store.comparisons_since(0.0)
    assert [c.verdict for c in stored] == ["mismatch", "match"]  # 2 card vends, no sale; none
    async with api.get("/api/audit", headers=read_headers) as resp:
        document = await resp.json()
    assert [c["verdict"] for c in document["intervals"]] == ["mismatch", "match"]
    assert document["in_all"]["verdict"] == "mismatch"
    # between the mismatch's end and the match's (reads some milliseconds apart): the match alone
    assert stored[1].until - stored[1].since > 1e-5
    later = f"{(stored[1].since + stored[1].until) / 2:.6f}"
    async with api.get(f"/api/audit?since={later}", headers=read_headers) as resp:
        document = await resp.json()
    assert [c["verdict"] for c in document["intervals"]] == ["match"]
    assert document["in_all"]["verdict"] == "match"
    async with api.get("/api/audit?since=last+tuesday", headers=read_headers) as resp:
        assert resp.status == 400
        assert (await resp.json())["detail"].startswith("since: ")
