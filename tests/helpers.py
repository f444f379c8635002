"""Small waiting, port and configuration helpers shared by the test folders."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# one copy, the benches' too (they run without the test tree): bench/_support.py
from bench._support import free_port as free_port


async def until(predicate: Callable[[], object], timeout: float = 30.0) -> None:
    """Wait until ``predicate()`` is true; TimeoutError after ``timeout`` seconds: a hang's
    guard, never what a test claims (5 s, the old default, was passed at load 11-15 by waits
    that take 0.1 s on a quiet machine). A wait that must end by a deadline of the product
    runs on its clock (FakeClock), not here."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


@contextlib.contextmanager
def hearing(agent: Any) -> Iterator[list[Any]]:
    """Each event the agent's bus publishes while inside, in order: its listener, dropped on
    the way out."""
    heard: list[Any] = []
    stop = agent.events.listen(heard.append)
    try:
        yield heard
    finally:
        stop()


def holding_cards(sim: Any, monkeypatch: Any) -> dict[str, Callable[[], None]]:
    """Each interaction the simulator ``sim`` (in this process) starts from now on waits with
    its card until the test presents it: ``holding_cards(...)[interaction_id]()``. Held as it
    starts, so no machine is too slow for it: a card 30 ms after the start (time scale 50)
    often came before the test's next step at load 11-15."""
    terminals = sim.ctx.terminals
    start, cards = terminals.start, {}

    def start_holding(*args: Any) -> dict[str, Any]:
        record: dict[str, Any] = start(*args)
        cards[record["interaction_id"]] = terminals.hold_card(record["interaction_id"])
        return record

    monkeypatch.setattr(terminals, "start", start_holding)
    return cards


def service_yaml(info: dict[str, Any], timeout: float = 5) -> str:
    """The ``service:`` section reaching a simulator (its READY ``info``) as a real process
    gets it: addresses in the file, the key and the client secret from the environment
    (``KIOSK_API_KEY``, ``KIOSK_CLIENT_SECRET``), as a unit's secrets come."""
    return (
        "service:\n"
        f"  base_url: {info['base_url']}\n"
        f"  reporting_url: {info['reporting_url']}\n"
        f"  ws_url: {info['ws_url']}\n"
        f"  mid: \"{info['mid']}\"\n"
        "  api_key: !env_var KIOSK_API_KEY\n"
        f"  client_id: {info['client_id']}\n"
        "  client_secret: !env_var KIOSK_CLIENT_SECRET\n"
        f"  timeout: {timeout}\n"
    )


ADMIN_TOKEN = "doctor-admin-token-0123456789"  # endpoint_config's secret admin_token


def write_config(directory: Path, body: str, secrets: dict[str, str] | None = None) -> Path:
    """``config.yaml`` holding ``body`` in ``directory``, and beside it ``secrets.yaml`` (mode 600,
    as a unit keeps it) holding ``secrets`` when given; returns the config's path."""
    if secrets:
        (directory / "secrets.yaml").write_text(
            "".join(f"{key}: {value}\n" for key, value in secrets.items())
        )
        (directory / "secrets.yaml").chmod(0o600)
    path = directory / "config.yaml"
    path.write_text(body)
    return path


def endpoint_config(directory: Path, sim: Any, terminals: str, extra: str = "") -> Path:
    """A config reaching the simulator ``sim`` with its secrets in ``secrets.yaml`` (``!secret``:
    the api key, refresh token, client secret and ``admin_token``), a journal, ``terminals``
    (YAML list items) and any ``extra`` sections; returns its path."""
    info = sim.ready_info()
    body = f"""
service:
  base_url: {info["base_url"]}
  reporting_url: {info["reporting_url"]}
  ws_url: {info["ws_url"]}
  api_key: !secret api_key
  refresh_token: !secret refresh_token
  mid: "{info["mid"]}"
  client_id: {info["client_id"]}
  client_secret: !secret client_secret
  credentials_path: keys.json
terminals:
{terminals}
journal: {{path: journal.db}}
{extra}
"""
    secrets = {
        "api_key": info["api_key"],
        "refresh_token": info["refresh_token"],
        "client_secret": info["client_secret"],
        "admin_token": ADMIN_TOKEN,
    }
    return write_config(directory, body, secrets)


async def sim_call(sim: Any, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """A simulator test helper (``/sim/...``, no auth): its JSON answer; fails unless 200."""
    import aiohttp

    async with aiohttp.ClientSession() as http, http.request(
        method, f"{sim.base_url}{path}", json=body
    ) as response:
        assert response.status == 200, await response.text()
        return await response.json()


def walk_to(journal: Any, record: Any, state: Any, step: Any = None, **fields: Any) -> Any:
    """Journal a sale from where it stands to ``state`` by the shortest way the transition table
    allows (as a flow would have), ``fields`` and ``step`` (if given) on the last write; the
    updated record. How tests leave a sale where a crash or a failed call would have."""
    from kiosk_agent.sales.states import SaleState

    path = shortest_path(record.flow, record.state, SaleState(state))
    assert path, f"no way from {record.state} to {state} in a {record.flow} sale"
    for n, (target, typical) in enumerate(path, start=1):
        last = n == len(path)
        name = step if last and step is not None else typical
        record = journal.record(record, name, target, **(fields if last else {}))
    return record


def shortest_path(flow: str, source: Any, target: Any) -> list[tuple[Any, Any]]:
    """The fewest moves the table allows from ``source`` to ``target`` in a sale of ``flow``:
    [(state, step)], each step one the edge takes (a flow's usual one where any will do)."""
    from collections import deque

    from kiosk_agent.sales.states import FLOW_STATES, TRANSITIONS, Flow, SaleState, Step

    usual = {
        SaleState.CHARGING: Step.CHARGE_CARD_REQUEST,
        SaleState.READING_CARD: Step.READ_CARD_REQUEST,
        SaleState.AUTHORIZING: Step.AUTHORIZE_REQUEST,
        SaleState.ENROLLING: Step.VAULT_REQUEST,
        SaleState.UNRESOLVED: Step.RECOVERY_WAITING,
        SaleState.DISPENSING: Step.DISPENSE_REQUEST,
        SaleState.CAPTURING: Step.CAPTURE_REQUEST,
        SaleState.REVERSING: Step.REVERSE_REQUEST,
        SaleState.COMPLETED: Step.COMPLETED,
        SaleState.DECLINED: Step.RECOVERY_DONE,
        SaleState.CANCELLED: Step.RECOVERY_DONE,
        SaleState.FAILED: Step.RECOVERY_DONE,
        SaleState.REVERSED: Step.REVERSE_DONE,
        SaleState.ATTENTION: Step.RECOVERY_UNDECIDED,
    }
    states = FLOW_STATES[Flow(flow)]
    ways: dict[Any, list[tuple[Any, Any]]] = {source: []}
    queue = deque([source])
    while queue:
        here = queue.popleft()
        if here is target:
            return ways[here]
        if here.final and here is not source:
            continue  # a way through an end is no way a flow goes
        for there, steps in TRANSITIONS[here].items():
            if there in ways or there not in states:
                continue
            name = usual[there] if steps is None or usual[there] in steps else min(steps)
            ways[there] = [*ways[here], (there, name)]
            queue.append(there)
    return []


class ErrorLog(logging.Handler):
    """Every ERROR logged while it listens: a traceback means a handler or task broke."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []
        logging.getLogger().addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def close(self) -> None:
        logging.getLogger().removeHandler(self)
        super().close()


# -- times in JSON (tests/admin/test_json_times.py) --------------------------------------------

ISO_UTC = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
# the payment service's records, passed through as it holds them: ISO 8601 UTC to the
# millisecond (docs/interface-choices.md)
SERVICE_ISO_UTC = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")
# a value that is a time (a sentence for people may quote one in its own words)
IS_A_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}[\d:.]*(Z|[+-]\d{2}:?\d{2})?")
# keys that name a moment; their value is ISO 8601 UTC or null, never a number
TIME_KEY = re.compile(r"^(at|since|until|answer_by|last_seen|.*_at)$")
# Unix seconds from 2001 to 5138: a number here is a timestamp in disguise
UNIX_SECONDS = (1e9, 1e11)


def json_time_problems(document: object, where: str = "") -> Iterator[str]:
    """Each value of ``document`` that is a time and not ISO 8601 UTC, with its path."""
    if isinstance(document, dict):
        for key, value in document.items():
            path = f"{where}.{key}"
            if TIME_KEY.match(str(key)) and value is not None and not isinstance(value, str):
                yield f"{path} = {value!r}: a time as a number"
            yield from json_time_problems(value, path)
    elif isinstance(document, list):
        for index, item in enumerate(document):
            yield from json_time_problems(item, f"{where}[{index}]")
    elif isinstance(document, str):
        if IS_A_TIME.fullmatch(document) and not (ISO_UTC.fullmatch(document)
                                                  or SERVICE_ISO_UTC.fullmatch(document)):
            yield f"{where} = {document!r}: not ISO 8601 UTC"
    elif (isinstance(document, int | float) and not isinstance(document, bool)
          and UNIX_SECONDS[0] <= document < UNIX_SECONDS[1]):
        yield f"{where} = {document!r}: Unix seconds"


class PythonCalls:
    """``with PythonCalls() as calls:`` lists the name of each Python function called inside
    (its own leaving not counted): what a hot path pays in calls, without timing anything."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def __enter__(self) -> list[str]:
        sys.setprofile(self._count)
        return self.names

    def __exit__(self, *_exc: object) -> None:
        sys.setprofile(None)

    def _count(self, frame: types.FrameType, event: str, _arg: object) -> None:
        if event == "call" and frame.f_code is not PythonCalls.__exit__.__code__:
            self.names.append(frame.f_code.co_name)


def in_a_fresh_python(
    probe: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``probe`` run by a Python process of its own (nothing imported yet); the test fails if
    it fails or takes over a minute."""
    return subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60,
        env=env,
    )
