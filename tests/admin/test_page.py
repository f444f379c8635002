"""The status page's server side over real HTTP: sessions, CSRF, roles, the event stream, doctor.

The browser itself is exercised in test_page_browser.py; these tests speak HTTP the way a
browser (or an attacker's page) would.
"""

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from kiosk_agent.admin.page import COOKIE, availability, health_notes
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.states import SaleState
from tests.admin.agent_thread import AgentThread, agent_thread
from tests.admin.conftest import ADMIN_TOKEN, READ_TOKEN, write_config
from tests.admin.test_server import _sell


def _origin(admin_server: Any) -> dict[str, str]:
    return {"Origin": admin_server.url}


async def _login(api: Any, admin_server: Any, token: str = ADMIN_TOKEN) -> str:
    async with api.post("/session", json={"token": token}, headers=_origin(admin_server)) as r:
        assert r.status == 200, await r.text()
        body = await r.json()
        cookie = r.headers["Set-Cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert token not in cookie
    return str(body["csrf"])


async def test_the_page_and_its_files_are_served_without_a_token(api: Any) -> None:
    async with api.get("/") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/html")
        assert "script-src 'self'" in r.headers["Content-Security-Policy"]
        assert r.headers["X-Frame-Options"] == "DENY"
        html = await r.text()
    assert '<script src="/static/page.js"' in html
    assert "//" not in html.replace("<!doctype", "")  # nothing fetched from outside
    for name, kind in (("page.js", "text/javascript"), ("page.css", "text/css")):
        async with api.get(f"/static/{name}") as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith(kind)
    async with api.get("/static/nope.js") as r:
        assert r.status == 404


async def test_data_needs_a_session_or_a_token(api: Any) -> None:
    for path in ("/api/page", "/api/events", "/api/doctor"):
        async with api.get(path) as r:
            assert r.status == 401, path
    async with api.get("/session") as r:
        assert await r.json() == {"role": None, "csrf": None}


async def test_a_wrong_token_opens_no_session(api: Any, admin_server: Any) -> None:
    headers = _origin(admin_server)
    async with api.post("/session", json={"token": "x" * 30}, headers=headers) as r:
        assert r.status == 401
        assert "not configured" in (await r.json())["detail"]
        assert COOKIE not in r.cookies
    async with api.post("/session", json={"tok": 1}, headers=headers) as r:
        assert r.status == 400
    async with api.post("/session", data="token=x", headers=headers) as r:
        assert r.status == 415  # a cross-site form cannot post JSON


async def test_a_session_reads_and_acts_with_its_csrf_token(api: Any, admin_server: Any) -> None:
    csrf = await _login(api, admin_server)
    async with api.get("/api/page") as r:
        assert r.status == 200
        page = await r.json()
    assert {t["device_id"] for t in page["health"]["terminals"]} == {"SIM-0001", "SIM-0007"}
    assert page["availability"]["available"] is True
    assert page["today_amount"] == "$0.00"
    headers = {**_origin(admin_server), "X-CSRF-Token": csrf}
    async with api.post("/api/terminals/SIM-0001/ping", headers=headers) as r:
        assert r.status == 200
        assert (await r.json())["online"] is True


async def test_cross_site_actions_are_refused(api: Any, admin_server: Any) -> None:
    csrf = await _login(api, admin_server)
    ping = "/api/terminals/SIM-0001/ping"
    async with api.post(ping, headers=_origin(admin_server)) as r:
        assert r.status == 403
        assert (await r.json())["error"] == "csrf"
    evil = {"Origin": "http://evil.example", "X-CSRF-Token": csrf}
    async with api.post(ping, headers=evil) as r:
        assert r.status == 403
        assert (await r.json())["error"] == "origin"
    async with api.post(ping, headers={"X-CSRF-Token": csrf}) as r:
        assert r.status == 403  # no Origin at all
    async with api.post("/session", json={"token": ADMIN_TOKEN}, headers=evil) as r:
        assert r.status == 403  # no login from another site either


async def test_a_read_session_reads_but_cannot_act(api: Any, admin_server: Any) -> None:
    csrf = await _login(api, admin_server, READ_TOKEN)
    async with api.get("/session") as r:
        assert (await r.json())["role"] == "read"
    async with api.get("/api/health") as r:
        assert r.status == 200
    headers = {**_origin(admin_server), "X-CSRF-Token": csrf}
    for path in ("/api/terminals/SIM-0001/ping", "/api/doctor"):
        async with api.post(path, headers=headers) as r:
            assert r.status == 403, path
            assert "admin token" in (await r.json())["detail"]


async def test_logout_ends_the_session(api: Any, admin_server: Any) -> None:
    csrf = await _login(api, admin_server)
    headers = {**_origin(admin_server), "X-CSRF-Token": csrf}
    async with api.delete("/session", headers=headers) as r:
        assert r.status == 200
    async with api.get("/api/page") as r:
        assert r.status == 401


async def test_a_stolen_cookie_from_another_agent_is_worthless(api: Any, admin_server: Any) -> None:
    await _login(api, admin_server)
    async with aiohttp.ClientSession(base_url=admin_server.url) as other:
        fake = {"Cookie": f"{COOKIE}=not-a-session"}
        async with other.get("/api/page", headers=fake) as r:
            assert r.status == 401


async def _events(response: Any) -> Any:
    """Parse server-sent events as they arrive: yields (event, data)."""
    event, data = "message", ""
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            event = line[len("event: ") :]
        elif line.startswith("data: "):
            data = line[len("data: ") :]
        elif line == "" and data:
            yield event, json.loads(data)
            event, data = "message", ""


async def test_the_event_stream_is_less_than_a_second_behind(
    agent: Any, api: Any, admin_server: Any
) -> None:
    await _login(api, admin_server)
    async with api.get("/api/events") as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        stream = _events(response)
        kind, first = await anext(stream)
        assert kind == "health"
        assert first["health"]["version"] == agent.version
        kind, doctor = await anext(stream)
        assert kind == "doctor"
        assert set(doctor) >= {"running", "checks"}
        # a health change: a terminal reported offline
        began = time.monotonic()
        agent.health.report_terminal("SIM-0001", online=False, detail="ping: terminal offline")
        kind, note = await asyncio.wait_for(anext(stream), 1.0)
        assert (kind, note["text"]) == ("note", "status ok -> degraded")
        kind, note = await anext(stream)
        assert note["text"] == "problem: terminal SIM-0001 offline ping: terminal offline"
        kind, view = await anext(stream)
        assert kind == "health"
        health_delay = time.monotonic() - began
        offline = next(t for t in view["health"]["terminals"] if t["device_id"] == "SIM-0001")
        assert offline["online"] is False
        # a sale step
        began = time.monotonic()
        agent.events.publish(
            SaleEvent("s1", "o1", "test", SaleState.CHARGING, 250, terminal="SIM-0007")
        )
        kind, sale = await asyncio.wait_for(anext(stream), 1.0)
        sale_delay = time.monotonic() - began
    assert kind == "sale"
    assert (sale["state"], sale["amount"], sale["terminal"]) == ("charging", "$2.50", "SIM-0007")
    print(f"event stream delay: health {health_delay:.3f} s, sale {sale_delay:.3f} s")
    assert health_delay < 1.0
    assert sale_delay < 1.0


async def test_an_open_stream_does_not_hold_up_the_agents_stop(
    tmp_path: Any, sim_settings: Any
) -> None:
    from kiosk_agent.app import load_agent
    from tests.admin.conftest import write_config

    # a stream that held the stop would cost the whole grace (a minute here), then be cut: a
    # bound of 5 s on the stop, the default grace, was the stop's own work at load 11-15
    config = write_config(tmp_path, "http: {shutdown_grace: 60}\n")
    agent = load_agent(config, sim_settings, systemd=False)
    await agent.start()
    server = next(c for c in agent.components if type(c).__name__ == "AdminServer")
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{server.url}/api/events", headers=headers) as response,
    ):
        assert response.status == 200
        began = time.monotonic()
        await agent.stop()
        assert time.monotonic() - began < 30.0


async def test_doctor_checks_run_from_the_agent_with_their_fixes(
    agent: Any, api: Any, admin_server: Any, sim: Any
) -> None:
    csrf = await _login(api, admin_server)
    async with aiohttp.ClientSession() as plain:
        await plain.post(f"{sim.base_url}/sim/terminals/SIM-0001/offline")
    headers = {**_origin(admin_server), "X-CSRF-Token": csrf}
    async with api.post("/api/doctor?wait=30", headers=headers) as r:
        assert r.status == 200  # ended within the wait: its verdicts
        report = await r.json()
    assert not report["running"]
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["service"]["verdict"] == "PASS"
    assert checks["ping SIM-0001"]["verdict"] == "FAIL"
    assert checks["ping SIM-0001"]["fix"] == (
        "power-cycle the reader and check its network cable or Wi-Fi"
    )
    assert checks["ping SIM-0007"]["verdict"] == "PASS"
    assert report["failed"] == 1
    # its count is the running agent's modules, and says so (the command's is named its own)
    assert "modules of the agent, pydantic and asyncio that the running agent loaded" in (
        checks["bytecode"]["detail"])
    async with api.get("/api/doctor") as r:
        assert (await r.json())["finished_at"] == report["finished_at"]


async def test_run_doctor_answers_at_once_and_says_the_runs_progress_until_its_verdicts(
    agent: Any, api: Any, admin_server: Any, monkeypatch: Any
) -> None:
    """The journal's check alone (SQLite's quick check of a year's file, 280 MiB) took the
    doctor's POST 1-2 s, 8 s at load 13: it answers at once now, 202, with the last verdicts
    (their ``finished_at``: how old) and the run's progress; GET says the same until the run
    ends; ``?wait=S`` waits up to S seconds for it. A second POST follows the run under way."""
    import threading

    from kiosk_agent.sales import journal_doctor

    reading = threading.Event()  # the journal's check, held in its worker thread
    check = journal_doctor.check_journal

    def slow_check(*args: Any, **kwargs: Any) -> None:
        assert reading.wait(30)
        check(*args, **kwargs)

    monkeypatch.setattr(journal_doctor, "check_journal", slow_check)
    csrf = await _login(api, admin_server)
    headers = {**_origin(admin_server), "X-CSRF-Token": csrf}
    began = time.monotonic()
    async with api.post("/api/doctor", headers=headers) as r:
        assert r.status == 202
        first = await r.json()
    # not the journal's check, held up to 30 s (a bound of 2 s read load, not the wait)
    assert time.monotonic() - began < 15.0
    assert first["running"]
    assert first["finished_at"] is None  # no run ended yet: none to show
    await until_checked(api, "config")
    async with api.post("/api/doctor?wait=0.05", headers=headers) as r:
        assert r.status == 202  # still under way: the same run, not a second
        again = await r.json()
    assert again["run"]["started_at"] == first["run"]["started_at"]
    assert "journal" not in again["run"]["checked"]
    reading.set()
    async with api.post("/api/doctor?wait=30", headers=headers) as r:
        assert r.status == 200
        ended = await r.json()
    assert not ended["running"]
    assert "run" not in ended
    names = [c["name"] for c in ended["checks"]]
    assert "journal" in names
    assert ended["started_at"] == first["run"]["started_at"]  # that run, not one more
    for wrong in ("-1", "61", "soon", "nan"):
        async with api.post(f"/api/doctor?wait={wrong}", headers=headers) as r:
            assert r.status == 400, wrong
            refused = await r.json()
        assert refused["error"] == "bad_parameter"
        assert "wait is seconds from 0 to 60" in refused["detail"]


async def until_checked(api: Any, name: str) -> None:
    """Until the doctor's run under way has made the check ``name`` (GET /api/doctor)."""
    deadline = time.monotonic() + 10
    while True:
        async with api.get("/api/doctor") as r:
            view = await r.json()
        if name in view.get("run", {}).get("checked", []):
            return
        assert time.monotonic() < deadline, view
        await asyncio.sleep(0.02)


def test_availability_counts_the_readers_that_can_take_cards_and_names_the_rest() -> None:
    off = {"device_id": "A", "available": False, "reason": "terminal A is offline", "since": 1.0}
    on = {"device_id": "B", "available": True, "reason": "", "since": 1.0}
    alone = availability({"availability": [off], "terminals": [{"device_id": "A", "name": "x"}]})
    assert alone["available"] is False
    assert alone["level"] == "down"
    assert alone["summary"] == "0 of 1 reader can take cards"
    assert alone["cannot"] == [
        {"device_id": "A", "name": "x", "reason": "terminal A is offline", "since": 1.0,
         "starting": False, "until": None}
    ]
    # one usable terminal keeps the machine selling, but it is not "available" in green:
    # degraded, 1 of 2, and the other's trouble is named
    both = availability({"availability": [off, on]})
    assert both["available"] is True
    assert both["level"] == "degraded"
    assert both["summary"] == "1 of 2 readers can take cards"
    assert both["reason"] == "A: terminal A is offline"
    assert availability({"availability": [on]})["level"] == "ok"
    none = availability({"availability": []})
    assert none["reason"] == "no terminal checked yet"
    assert none["level"] == "down"


def test_a_reader_failing_its_checks_during_the_hold_off_is_not_counted_as_taking_cards() -> None:
    # One lost ping must not take a reader off the bus, so the agent holds it in service a
    # moment; the page must not say "2 of 2 can take cards" beside its OFFLINE badge meanwhile.
    held = {"device_id": "A", "available": True, "reason": "", "since": 1.0,
            "failing": "terminal offline: ping timed out"}
    on = {"device_id": "B", "available": True, "reason": "", "since": 1.0, "failing": ""}
    shown = availability({"availability": [held, on]})
    assert shown["summary"] == "1 of 2 readers can take cards"
    assert shown["level"] == "degraded"
    assert shown["cannot"] == [{
        "device_id": "A", "name": None, "since": None, "starting": False, "until": None,
        "reason": "terminal offline: ping timed out (checked again before it is taken out of "
                  "service)",
    }]


def test_a_reader_recovery_holds_after_a_restart_is_not_counted_as_taking_cards() -> None:
    # In service (its reader not stepped aside), but recovery listens for a vend a restart
    # left on it: a sale there is refused until then, so it cannot take cards, and says why
    held = {"device_id": "A", "available": True, "reason": "", "since": 1.0,
            "recovering": "recovering: listening for the vend result of sale 1a7e0001, left "
                          "in flight by the last stop or crash, until 10:15:30Z",
            "recovering_until": 1796000130.0}
    on = {"device_id": "B", "available": True, "reason": "", "since": 1.0, "recovering": ""}
    shown = availability({"availability": [held, on]})
    assert shown["summary"] == "1 of 2 readers can take cards"
    assert shown["cannot"] == [{
        "device_id": "A", "name": None, "since": None, "starting": False,
        "until": 1796000130.0, "reason": held["recovering"],
    }]
    # out of service says that first: its reason is why it cannot, whatever recovery does
    out = {**held, "available": False, "reason": "terminal offline"}
    [cannot] = availability({"availability": [out]})["cannot"]
    assert (cannot["reason"], cannot["until"]) == ("terminal offline", None)
    # the event log (the page's, `kiosk-agent events`): the hold taken and let go, once each
    free = {**held, "recovering": "", "recovering_until": None}
    base = {"status": "ok", "problems": []}
    assert health_notes({**base, "availability": [free]}, {**base, "availability": [held]}) == [
        f"A cannot take cards: {held['recovering']}"
    ]
    assert health_notes({**base, "availability": [held]}, {**base, "availability": [held]}) == []
    assert health_notes({**base, "availability": [held]}, {**base, "availability": [free]}) == [
        "A can take cards again"
    ]


def test_a_reader_out_while_the_agent_starts_says_starting() -> None:
    waiting = {"device_id": "A", "available": False, "since": 1.0, "starting": True,
               "reason": "journal: reading its file whole before money moves on it"}
    shown = availability({"availability": [waiting]})
    assert shown["summary"] == "0 of 1 reader can take cards"
    assert shown["cannot"] == [{
        "device_id": "A", "name": None, "since": 1.0, "starting": True, "until": None,
        "reason": "starting: journal: reading its file whole before money moves on it",
    }]
    ready = {"device_id": "A", "available": True, "since": 2.0, "reason": ""}
    out = {**ready, "available": False, "reason": "terminal offline"}
    base = {"status": "ok", "problems": []}
    assert health_notes({**base, "availability": []}, {**base, "availability": [waiting]}) == []
    assert health_notes({**base, "availability": [waiting]}, {**base, "availability": [ready]}) == [
        "A can take cards"
    ]
    assert health_notes({**base, "availability": [ready]}, {**base, "availability": [out]}) == [
        "A cannot take cards: terminal offline"
    ]
    assert health_notes({**base, "availability": [out]}, {**base, "availability": [ready]}) == [
        "A can take cards again"
    ]


def test_health_notes_name_what_changed() -> None:
    before = {"status": "ok", "problems": ["a"]}
    after = {"status": "degraded", "problems": ["b"]}
    assert health_notes(before, after) == ["status ok -> degraded", "problem: b", "cleared: a"]
    assert health_notes(None, after) == []


@pytest.fixture(scope="module")
def login_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentThread]:
    """One agent for the refused logins (one each cost 1.5 s of CPU for eleven): a refusal
    opens no session, and the one wrong token among them is far below GUESSES_ALLOWED."""
    with agent_thread(write_config(tmp_path_factory.mktemp("logins"))) as rig:
        yield rig


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'"token"',
        b"null",
        b'{"token": 5}',
        b'{"token": ""}',
        b'{"token": ["admin-token-0123456789abcdef"]}',
        b'{"token": "' + b"a" * 60_000 + b'"}',
        b"\xff\xfe{not utf-8",
        b"{" * 5_000,
        b'{"a":' * 30_000 + b"1" + b"}" * 30_000,  # deep enough to break a recursive parser
        b'{"token": ' + b"9" * 5_000 + b"}",
    ],
)
def test_hostile_login_bodies_get_a_clear_no(login_rig: AgentThread, body: bytes) -> None:
    port = login_rig.ports["AdminServer"]
    headers = {"Origin": f"http://127.0.0.1:{port}", "Content-Type": "application/json"}
    status, answer, got = login_rig.exchange("AdminServer", "POST", "/session", body, headers)
    assert status in (400, 401), answer
    assert answer["detail"]
    assert not [c for c in got.get_all("Set-Cookie") or [] if c.startswith(f"{COOKIE}=")]


async def test_too_many_event_streams_are_refused_and_sales_go_on(
    agent: Any, admin_server: Any
) -> None:
    from kiosk_agent.admin.page import MAX_STREAMS

    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession(base_url=admin_server.url, headers=headers) as session:
        streams = [await session.get("/api/events") for _ in range(MAX_STREAMS)]
        try:
            assert all(s.status == 200 for s in streams)
            async with session.get("/api/events") as extra:
                assert extra.status == 503
                assert "event streams" in (await extra.json())["detail"]
            final = await asyncio.wait_for(_sell(agent, 250), 15)
            assert final.state is SaleState.COMPLETED
        finally:
            for stream in streams:
                stream.close()


async def test_a_session_ends_after_its_lifetime(api: Any, admin_server: Any) -> None:
    await _login(api, admin_server)
    async with api.get("/api/page") as r:
        assert r.status == 200
    for session in admin_server.page._sessions.values():
        session.expires_at = time.monotonic() - 1  # twelve hours later
    async with api.get("/api/page") as r:
        assert r.status == 401
    assert admin_server.page._sessions == {}


@pytest.mark.parametrize("step", [3 * 86_400.0, -3 * 86_400.0])
async def test_a_wall_clock_step_neither_ends_nor_stretches_a_session(
    api: Any, admin_server: Any, monkeypatch: pytest.MonkeyPatch, step: float
) -> None:
    from types import SimpleNamespace

    from kiosk_agent.admin import page

    await _login(api, admin_server)
    stepped = SimpleNamespace(time=lambda: time.time() + step, monotonic=time.monotonic)
    monkeypatch.setattr(page, "time", stepped)  # NTP steps the unit's wall clock
    async with api.get("/api/page") as r:
        assert r.status == 200  # a step forward does not log the tech out
    [session] = admin_server.page._sessions.values()
    assert session.expires_at <= time.monotonic() + page.SESSION_LIFETIME_S  # nor lengthens it


def test_a_clear_says_what_cleared() -> None:
    """Before: "cleared: 1 sale(s) need attention" right after "problem: 2 sale(s) need
    attention" read as if something had been fixed, and both lines came for one change."""
    def health(*problems: str) -> dict[str, Any]:
        return {"status": "degraded" if problems else "ok", "problems": list(problems)}

    two, one = health("2 sale(s) need attention"), health("1 sale(s) need attention")
    assert health_notes(two, one) == ["cleared: 1 sale(s) resolved; 1 still need(s) a person"]
    assert health_notes(one, two) == ["problem: 2 sale(s) need attention (1 more)"]
    assert health_notes(one, health()) == [
        "status degraded -> ok", "cleared: 1 sale(s) resolved; none needs a person now",
    ]
    assert health_notes(health("API key expires in 90 s"), health("API key expires in 30 s")) == [
        "problem: API key expires in 30 s (was: API key expires in 90 s)"
    ]


async def test_a_browser_reconnecting_gets_the_steps_it_missed_from_its_last_event_id(
    agent: Any, admin_server: Any
) -> None:
    """A page whose link dropped opens the stream again with the id of the last step it got
    (EventSource does it by itself): the steps journaled since come first, then live ones."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession(base_url=admin_server.url, headers=headers) as http:
        async with http.get("/api/events") as response:
            assert (await response.content.readline()) == b"retry: 1000\n"  # wait 1 s, not 3
            stream = _events(response)
            first = await _sell(agent, 250)
            kind, step = await asyncio.wait_for(_next_sale(stream), 5.0)
        last_id = repr(step["at"])  # the `id:` of that event
        later = await _sell(agent, 250)  # while no page listens
        missed = [s.step for s in agent.journal.steps(first.sale_id) if s.at >= step["at"]]
        missed += [s.step for s in agent.journal.steps(later.sale_id)]
        async with http.get("/api/events", headers={"Last-Event-ID": last_id}) as response:
            stream = _events(response)
            fetched = []
            async with asyncio.timeout(5.0):
                async for kind, data in stream:
                    if kind == "replayed":
                        break
                    if kind == "sale":
                        assert data["replayed"] is True
                        fetched.append(data["step"])
    assert fetched == missed
    assert data["count"] == len(missed)


async def _next_sale(stream: Any) -> tuple[str, dict[str, Any]]:
    async for kind, data in stream:
        if kind == "sale":
            return kind, data
    raise AssertionError("the stream ended")


async def test_the_doctor_runs_again_when_a_problem_comes_not_when_a_countdown_ticks() -> None:
    """The checks follow the health (a Doctor card saying "0 failed" under DOWN was another
    moment's), but a key's countdown, a new problem each second, must not run them for ever."""
    from types import SimpleNamespace

    from kiosk_agent.admin.page import StatusPage, TokenGuesses
    from kiosk_agent.doctor import Report

    problems = ["API key expires in 3600 s"]
    health = SimpleNamespace(snapshot=lambda: SimpleNamespace(problems=list(problems)))
    page = StatusPage(SimpleNamespace(health=health), lambda _: (None, None), TokenGuesses())
    runs: list[list[str]] = []

    async def checks() -> None:
        runs.append(list(problems))
        page.doctor = Report()
        page._doctor_done.set()

    page._doctor_task = type(page._doctor_task)(checks, "test-doctor")
    page._start_doctor()
    await page._doctor_task._task
    problems[0] = "API key expires in 3599 s"
    await page._doctor_follows(problems)
    await page._doctor_task._task  # a run started now would have ended here
    assert len(runs) == 1
    problems.append("terminal SIM-0001 offline")
    await page._doctor_follows(problems)
    await page._doctor_task._task
    assert runs[-1] == ["API key expires in 3599 s", "terminal SIM-0001 offline"]
    assert len(runs) == 2


@pytest.mark.parametrize("available", [True, False], ids=["in", "out"])
@pytest.mark.parametrize("recovering", ["", "recovering: listening for the vend result of sale "
                                            "1a7e0001 until 10:15:30Z"], ids=["free", "held"])
def test_the_page_and_the_health_command_read_takes_cards_as_the_health_model_does(
    available: bool, recovering: str
) -> None:
    # One reading of "takes cards" (AvailabilityHealth.takes_cards): the readers' count (the
    # page's and `kiosk-agent health`'s) and the page's event log say of a terminal what the
    # health model's own property says, on the same health as the admin API sends it.
    from kiosk_agent.health.model import UNIX_TIMES, AvailabilityHealth
    from kiosk_agent.health.readers import takes_cards

    model = AvailabilityHealth(device_id="A", available=available, since=1.0,
                               reason="" if available else "terminal offline",
                               recovering=recovering,
                               recovering_until=1796000130.0 if recovering else None)
    state = model.model_dump(mode="json", context=UNIX_TIMES)
    assert takes_cards(state) is model.takes_cards
    shown = availability({"availability": [state]})
    assert (shown["able"], [c["device_id"] for c in shown["cannot"]]) == (
        (1, []) if model.takes_cards else (0, ["A"]))
    # the event log: the change into this state, from its opposite, says the same
    opposite = {**state, "available": True, "recovering": "" if not model.takes_cards
                else "recovering: listening"}
    assert takes_cards(opposite) is not model.takes_cards
    base = {"status": "ok", "problems": []}
    [note] = health_notes({**base, "availability": [opposite]}, {**base, "availability": [state]})
    assert note.startswith("A can take cards" if model.takes_cards else "A cannot take cards"), note
    # a state that names no availability (none the model makes) is never said to take cards
    unnamed = {k: v for k, v in state.items() if k != "available"}
    assert not takes_cards(unnamed)
    assert availability({"availability": [unnamed]})["able"] == 0
    [note] = health_notes({**base, "availability": [{**unnamed, "available": True,
                                                     "recovering": ""}]},
                          {**base, "availability": [unnamed]})
    assert note.startswith("A cannot take cards"), note
