"""``kiosk-agent sim``: the whole payment service, served locally for tests and demos."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiosk_agent.cli.contract import EXIT_USAGE, positive_number, stop_on_signals
from kiosk_agent.cli.embedded import (  # noqa: F401 - where the tests take them
    embedded_simulator,
    simulated_machines,
)

# The simulator and the service's settings (pydantic) are imported when a simulator starts:
# `--help` and shell completion build this parser without them.
if TYPE_CHECKING:
    from kiosk_agent.service.settings import ServiceSettings
    from kiosk_agent.sim.server import SimOptions

DEFAULT_PORT = 8990
READY = "READY "  # the line `kiosk-agent sim` prints once it listens: READY {json}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "sim",
        help="run the payment service simulator",
        description="Serve the payment service's whole interface locally. Prints one line "
        "'READY {json}' (addresses and credentials) once it listens.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any)"
    )
    parser.add_argument(
        "--time-scale", type=positive_number, default=1.0,
        help="run simulated durations X times faster (default 1)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=1, help="seed of the data set and card tokens")
    parser.add_argument(
        "--transactions",
        type=_count,
        default=1000,
        help="size of the seeded reporting data set",
    )
    parser.add_argument("--webhook-url", help="deliver boarding webhooks to this URL")
    parser.add_argument("--webhook-secret", help="HMAC secret that signs webhook deliveries")
    parser.add_argument(
        "--rate-limit", type=_rate_limit, help="terminal rate limit as R/S: R requests per S s"
    )
    parser.add_argument("--data-dir", type=Path, help="keep state in DIR/sim.db across restarts")
    parser.add_argument(
        "--chaos", action="store_true", help="duplicate and reorder webhook deliveries"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true",
        help="log each request and event (interactions, terminals, webhooks) on one line, stderr",
    )
    parser.set_defaults(handler=run_sim)
    _register_trigger(parser)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    return value


def _port(text: str) -> int:
    value = _count(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {text!r}")
    return value


def _rate_limit(text: str) -> str:
    from kiosk_agent.sim.ratelimit import RateLimit

    try:
        RateLimit.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def settings_from_ready(info: Mapping[str, Any], **tuning: Any) -> ServiceSettings:
    """The client settings that reach a simulator as its merchant, from its READY information
    (``SimServer.ready_info()``, or the JSON of the ``READY`` line); ``tuning``: other fields."""
    from kiosk_agent.service.settings import ServiceSettings

    return ServiceSettings.reaching_simulator(info, **tuning)


def parse_ready(line: str) -> dict[str, Any] | None:
    """The information of a ``READY {json}`` line (another process's simulator); None for any
    other line."""
    if not line.startswith(READY):
        return None
    info: dict[str, Any] = json.loads(line[len(READY) :])
    return info


def options_from_args(args: argparse.Namespace) -> SimOptions:
    from kiosk_agent.sim.server import SimOptions

    return SimOptions(
        host=args.host,
        port=args.port,
        time_scale=args.time_scale,
        seed=args.seed,
        transactions=args.transactions,
        webhook_url=args.webhook_url,
        webhook_secret=args.webhook_secret,
        rate_limit=args.rate_limit,
        data_dir=args.data_dir,
        chaos=args.chaos,
        verbose=args.verbose,
    )


async def run_sim(args: argparse.Namespace) -> int:
    import sqlite3

    from kiosk_agent.sim.server import SimServer

    if args.verbose:
        import logging

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        sim_logs = logging.getLogger("kiosk_agent.sim")
        sim_logs.addHandler(handler)
        sim_logs.setLevel(logging.DEBUG)
        sim_logs.propagate = False
    server = SimServer(options_from_args(args))
    try:
        await server.start()
    except (OSError, sqlite3.Error) as err:
        # a busy port, an unwritable --data-dir, a file there that is not a database
        print(f"error: cannot start the simulator: {err}", file=sys.stderr)
        return 1
    stop = stop_on_signals()
    print(f"{READY}{json.dumps(server.ready_info())}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
    return 0


# -- sim trigger: the test helpers from the command line (as `stripe trigger` does) ------------

SIM_URL_ENV = "KIOSK_BASE_URL"
# Who moves a merchant: service.models.boarding.MerchantTrigger's values, here without pydantic
# for the parser (tests/cli/test_sim_trigger.py holds them equal)
MERCHANT_TRIGGERS = ("api", "ui", "system")
# The simulator's faults (sim/faults.FAULTS) and its seeded key (sim/auth.API_KEY), kept here
# without the simulator for the parser; the tests hold them equal.
FAULTS = (
    "drop_answer", "slow_answer", "delay", "hold", "server_error", "server_error_after_commit",
    "unavailable", "rate_limited", "first_poll_rate_limited", "black_hole", "latency",
    "ws_drop_after_confirm",
)  # fmt: skip
SIM_API_KEY = "sim_api_key"
# Where the agent's money calls go: an authorization or a charge, a capture, a void.
PAYMENTS_CALLS = "/api/v1/*"
AUTHORIZATION = "/api/v1/charge"
DEFAULT_TERMINAL = "SIM-0001"
# How often a ready-made sale's interaction is asked for its outcome.
_POLL_S = 0.1


def _register_trigger(parser: argparse.ArgumentParser) -> None:
    from kiosk_agent.cli.contract import case_insensitive, guarded, options

    actions = parser.add_subparsers(dest="sim_action", metavar="ACTION")
    trigger = actions.add_parser(
        "trigger",
        help="drive a running simulator: ready-made scenarios, faults by name, settle, merchants",
        description="Play a ready-made scenario or one of the simulator's test helpers on a "
        f"running simulator, no JSON to write: --url, else ${SIM_URL_ENV}, else "
        f"http://127.0.0.1:{DEFAULT_PORT}.",
    )
    events = trigger.add_subparsers(dest="event", metavar="EVENT", required=True)
    common = options(config=False, timeout=True)
    subs = []

    def event(name: str, text: str) -> argparse.ArgumentParser:
        sub = events.add_parser(name, parents=common, help=text, description=text)
        subs.append(sub)
        return sub

    for name, text in (
        ("sale", "a customer pays on a reader: a charge-card, approved"),
        ("declined", "a customer's card is declined on a reader (an amount ending in 02)"),
    ):
        sale = event(name, text)
        sale.add_argument("--terminal", default=DEFAULT_TERMINAL, metavar="DEVICE",
                          help=f"the reader (default {DEFAULT_TERMINAL})")
        sale.add_argument("--amount", metavar="DOLLARS",
                          help="what it charges (default 2.50; 2.02 for declined)")
    for name, text in (
        ("lost-answer", f"the next authorization or charge (POST {AUTHORIZATION}) is made and "
                        "its answer lost: the agent must find out what happened"),
        ("service-500", f"the next payments call (POST {PAYMENTS_CALLS}) answers 500, "
                        "processing nothing"),
    ):
        armed = event(name, text)
        armed.add_argument("--count", type=_positive_count, default=1,
                           help="how many calls it takes (default 1)")
    for name, text in (
        ("reader-offline", "a reader goes offline"), ("reader-online", "a reader comes back"),
        ("terminal-offline", "a reader goes offline (as reader-offline)"),
        ("terminal-online", "a reader comes back (as reader-online)"),
    ):
        event(name, text).add_argument("device", metavar="DEVICE", help="e.g. SIM-0003")
    fault = event("fault", "arm one of the simulator's faults by its name")
    fault.add_argument("fault", metavar="NAME", type=case_insensitive(list(FAULTS)),
                       help=", ".join(FAULTS))
    fault.add_argument("--path", help=f"the calls it takes: exact, or a prefix ending in * "
                       f"(default {PAYMENTS_CALLS})")
    fault.add_argument("--method", type=case_insensitive(["GET", "POST", "PUT", "DELETE", "*"]),
                       help="GET, POST (default), PUT, DELETE or * (any)")
    fault.add_argument("--count", type=_positive_count, help="the next N matching calls")
    fault.add_argument("--share", type=positive_number,
                       help="that share (0 to 1) of matching calls, until cleared")
    fault.add_argument("--delay", type=positive_number, metavar="S",
                       help="seconds, for slow_answer, delay and latency")
    event("faults", "list the faults armed and how many calls each took")
    event("clear", "disarm every fault")
    event("settle", "settle the open batch now (deposits appear in reporting)")
    status = event(
        "merchant-status",
        "move a merchant to any status (the service's own moves; sends its webhook)",
    )
    status.add_argument("merchant_id", metavar="MERCHANT_ID", type=int)
    status.add_argument("status", metavar="STATUS",
                        help="new, sent_for_signature, signed, in_underwriting, boarded, live, "
                        "cancelled, declined, deleted")
    movers = list(MERCHANT_TRIGGERS)
    status.add_argument("--trigger", dest="moved_by", type=case_insensitive(movers),
                        help=f"who moved it: {', '.join(movers)} (default: ui)")
    for sub in subs:
        sub.add_argument("--url", help=f"the simulator (default ${SIM_URL_ENV}, else "
                         f"http://127.0.0.1:{DEFAULT_PORT})")
        sub.set_defaults(handler=guarded(trigger_command))


def _positive_count(text: str) -> int:
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text!r}")
    return value


def trigger_request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None]:
    """(method, the helper's path, its JSON body) for ``args.event``."""
    event = args.event.replace("terminal-", "reader-")
    if event == "settle":
        return "POST", "/sim/settle", None
    if event in ("reader-offline", "reader-online"):
        return "POST", f"/sim/terminals/{args.device}/{event.removeprefix('reader-')}", None
    if event == "lost-answer":
        return "POST", "/sim/faults", {"fault": "drop_answer", "path": AUTHORIZATION,
                                       "count": args.count}
    if event == "service-500":
        return "POST", "/sim/faults", {"fault": "server_error", "path": PAYMENTS_CALLS,
                                       "count": args.count}
    if event == "fault":
        body = {"fault": args.fault, "path": args.path, "method": args.method,
                "count": args.count, "share": args.share, "delay_s": args.delay}
        if args.path is None and args.fault not in ("first_poll_rate_limited",
                                                    "ws_drop_after_confirm"):
            body["path"] = PAYMENTS_CALLS  # those two have their own default
        return "POST", "/sim/faults", {k: v for k, v in body.items() if v is not None}
    if event == "faults":
        return "GET", "/sim/faults", None
    if event == "clear":
        return "DELETE", "/sim/faults", None
    body = {"merchant_status": args.status.strip().lower()}
    if args.moved_by:
        body["trigger"] = args.moved_by
    return "POST", f"/sim/merchants/{args.merchant_id}/status", body


async def trigger_command(args: argparse.Namespace) -> int:
    from kiosk_agent.cli.contract import EXIT_OK, print_json, timeout_of, wants_json
    from kiosk_agent.cli.waiting import waiting

    base = (args.url or os.environ.get(SIM_URL_ENV) or f"http://127.0.0.1:{DEFAULT_PORT}")
    within = timeout_of(args)
    async with waiting(f"the simulator at {base}", within), _Sim(base, within) as sim:
        if args.event in ("sale", "declined"):
            answer = await _sale(sim, args)
        else:
            method, path, body = trigger_request(args)
            answer = await sim.call(method, path, body, args.event)
    if wants_json(args):
        print_json(answer)
    else:
        print(_trigger_summary(args, answer))
    return EXIT_OK


class _Sim:
    """The simulator's HTTP API for one command: an unreachable simulator is exit 4 in plain
    words, a refusal exit 1 with the simulator's own."""

    def __init__(self, base: str, within: float) -> None:
        import aiohttp

        self.base = base.rstrip("/")
        self.within = within
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=within))

    async def __aenter__(self) -> _Sim:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.close()

    async def call(
        self, method: str, path: str, body: dict[str, Any] | None, what: str,
        headers: dict[str, str] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        import aiohttp

        from kiosk_agent.cli.contract import EXIT_UNREACHABLE, CliError
        from kiosk_agent.service.errors import network_words

        try:
            async with self._http.request(
                method, self.base + path, json=body, headers=headers
            ) as response:
                text = await response.text()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as err:
            raise CliError(f"no simulator at {self.base}: {network_words(err)}",
                           EXIT_UNREACHABLE, ["start one: `kiosk-agent sim`"]) from None
        try:
            answer = json.loads(text) if text else {}
        except json.JSONDecodeError:
            answer = {"detail": text[:200]}
        if not isinstance(answer, dict):
            answer = {"items": answer}
        if status not in (200, 201, 202):
            detail = answer.get("detail") or answer.get("error") or f"HTTP {status}"
            raise CliError(f"the simulator refused {what}: {detail}")
        return answer


async def _sale(sim: _Sim, args: argparse.Namespace) -> dict[str, Any]:
    """A customer on a reader: a charge-card interaction with the simulator's seeded key, its
    outcome waited for (the card is presented 1.5 simulated seconds after it starts)."""
    import asyncio

    from kiosk_agent.cli.contract import CliError
    from kiosk_agent.money import MoneyError, dollars_to_cents, format_cents

    text = args.amount or ("2.02" if args.event == "declined" else "2.50")
    try:
        cents = dollars_to_cents(text)
    except MoneyError as err:
        raise CliError(f"--amount {text!r}: {err}", EXIT_USAGE) from None
    auth = {"Authorization": f"Bearer {SIM_API_KEY}"}
    where = f"/api/terminal/{args.terminal}/charge-card"
    started = await sim.call("POST", where, {"amount": cents}, args.event, auth)
    while True:
        record = await sim.call("GET", f"{where}/{started['interaction_id']}", None,
                                args.event, auth)
        if record.get("status") != "pending":
            return {**record, "amount": format_cents(cents)}
        await asyncio.sleep(_POLL_S)


def _trigger_summary(args: argparse.Namespace, answer: dict[str, Any]) -> str:
    event = args.event.replace("terminal-", "reader-")
    if event == "settle":
        deposits = answer.get("deposits", [])
        return f"settled {answer.get('settled', 0)} transaction(s) into {len(deposits)} deposit(s)"
    if event.startswith("reader-"):
        return f"{args.device} is {'online' if answer.get('online') else 'offline'}"
    if event in ("sale", "declined"):
        return _sale_summary(args, answer)
    if event in ("lost-answer", "service-500", "fault"):
        return _fault_summary(answer)
    if event == "faults":
        faults = answer.get("items") or answer.get("faults") or []
        return "\n".join(_fault_line(f) for f in faults) or "no fault armed"
    if event == "clear":
        return "every fault disarmed"
    return f"merchant {args.merchant_id} is {args.status.strip().lower()} (webhook sent)"


def _sale_summary(args: argparse.Namespace, answer: dict[str, Any]) -> str:
    result = answer.get("result") or {}
    where = f"{args.terminal}: {answer['amount']}"
    if answer.get("status") != "succeeded":
        return f"{where} {answer.get('status')} (no money moved)"
    code = str(result.get("result"))
    words = {"A": "approved", "B": "retry", "C": "declined"}.get(code, "answered")
    return f"{where} {words}, transaction {result.get('trans_id') or '-'}"


_FAULT_WORDS = {
    "drop_answer": "made, then its answer lost",
    "server_error": "answered 500, nothing made",
    "server_error_after_commit": "made, then answered 500",
    "unavailable": "answered 503, nothing made",
    "rate_limited": "answered 429, nothing made",
    "slow_answer": "made at once, answered late",
    "delay": "made late",
    "hold": "held, made when released",
    "latency": "slowed down",
    "black_hole": "held, never answered",
    "first_poll_rate_limited": "answered 429 on its first status poll",
    "ws_drop_after_confirm": "cut right after it subscribes",
}


def _fault_summary(fault: dict[str, Any]) -> str:
    return f"armed {_fault_line(fault)}; `kiosk-agent sim trigger clear` disarms it"


def _fault_line(fault: dict[str, Any]) -> str:
    calls = (f"the next {fault['count']} call(s)" if fault.get("count")
             else f"{fault['share']:.0%} of calls" if fault.get("share") else "every call")
    kind = str(fault.get("fault"))
    late = (f" by {fault['delay_s']:g} s" if kind in _DELAYED
            and isinstance(fault.get("delay_s"), int | float) else "")  # fmt: skip
    return (f"{fault.get('id')}: {calls} to {fault.get('method')} {fault.get('path')} "
            f"{_FAULT_WORDS.get(kind, fault.get('fault'))}{late} "
            f"({fault.get('hits', 0)} taken so far)")


# the faults whose delay_s is what a tester armed them for
_DELAYED = {"latency", "slow_answer", "delay"}
