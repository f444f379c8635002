"""The text protocol of the common MDB serial adapters, cashless-slave side: lines in, lines out.

No I/O and no state here; ``mdb.py`` drives a session with these pieces and ``sim/machine.py`` plays
the vending machine controller with the same ones, so both ends agree by construction.

Wire format (one line each, ``\\n`` terminated; upper-case ``C`` to the adapter, lower-case ``c``
from it)::

    C,0 / C,SETCONF,mdb-addr=0x10 / C,1      reset, configure, enable the cashless slave
                                             (C,0 alone: off the bus, "cashless unavailable")
    c,STATUS,INACTIVE|DISABLED|ENABLED       the controller's view of us
    c,STATUS,IDLE[,<funds>]                  a session is open (card-first: after C,START)
    c,STATUS,VEND,<amount>,<product>         the customer selected: a vend request
    C,VEND,<amount>                          approve    /   C,STOP   deny or end the session
    C,START,<funds>                          open a pre-authorized (card-first) session
    c,VEND,SUCCESS                           dispensed  /   c,ERR,VEND 3   dispense failed
    r,ACK, c,1, d,...                        acknowledgements and master-side chatter: ignored

Amounts on the wire: the common adapters send decimal currency units with two places (``2.50``
for $2.50); some firmwares send integer cents (``250``). ``AmountUnit`` says which, and every
conversion goes through ``kiosk_agent.money``.
"""

from __future__ import annotations

import enum

from kiosk_agent.data_class import data_class
from kiosk_agent.money import MoneyError, cents_to_dollars, parse_wire_amount
from kiosk_agent.platforms.mdb_units import AmountUnit as AmountUnit  # the wire's, re-exported

VEND_FAILED_CODE = "VEND 3"
# The longest line worth reading: real adapter lines are under 40 characters.
MAX_LINE = 200


class ProtocolError(ValueError):
    """A line that looks like the adapter's but cannot be understood; says what was wrong."""


class ControllerStatus(enum.StrEnum):
    INACTIVE = "INACTIVE"  # just reset / not configured
    DISABLED = "DISABLED"  # configured but not allowed to take payments
    ENABLED = "ENABLED"  # ready, no session
    IDLE = "IDLE"  # a session is open, waiting for a selection


def parse_amount(text: str, unit: AmountUnit) -> int:
    """The one wire grammar (``kiosk_agent.money.parse_wire_amount``): ``2.50`` or ``250``."""
    try:
        return parse_wire_amount(text, unit.value)
    except MoneyError as err:
        raise ProtocolError(f"bad amount: {err}") from None


def format_amount(cents: int, unit: AmountUnit) -> str:
    return str(cents) if unit is AmountUnit.CENTS else cents_to_dollars(cents)


def _shown(line: str) -> str:
    """A line quoted in an error, cut short: garbage can be long."""
    return repr(line if len(line) <= 60 else line[:57] + "...")


# -- what the adapter says ---------------------------------------------------------------------


@data_class(frozen=True, slots=True)
class StatusChanged:
    status: ControllerStatus
    funds_cents: int | None = None


@data_class(frozen=True, slots=True)
class VendRequested:
    amount_cents: int
    product: str


@data_class(frozen=True, slots=True)
class VendSucceeded:
    pass


@data_class(frozen=True, slots=True)
class VendFailed:
    code: str


@data_class(frozen=True, slots=True)
class AdapterError:
    text: str


@data_class(frozen=True, slots=True)
class Chatter:
    """Acknowledgements, echoes and master-side lines: expected, meaningless for the session."""

    line: str


AdapterMessage = StatusChanged | VendRequested | VendSucceeded | VendFailed | AdapterError | Chatter


def parse_adapter_line(line: str, unit: AmountUnit = AmountUnit.DOLLARS) -> AdapterMessage:
    """One line from the adapter -> a message; ``ProtocolError`` naming the problem otherwise."""
    if len(line) > MAX_LINE:
        raise ProtocolError(f"line too long ({len(line)} characters): {_shown(line)}")
    parts = line.strip().split(",")
    head = parts[0]
    if head in ("r", "d") or (head == "c" and len(parts) == 2 and parts[1] in ("0", "1")):
        return Chatter(line)
    if head != "c" or len(parts) < 2:
        raise ProtocolError(f"not an adapter line: {_shown(line)}")
    kind = parts[1].upper()
    if kind == "STATUS":
        return _parse_status(parts[2:], line, unit)
    if kind == "VEND" and len(parts) == 3 and parts[2].upper() == "SUCCESS":
        return VendSucceeded()
    if kind == "ERR":
        text = ",".join(parts[2:])
        if text.upper().startswith(VEND_FAILED_CODE):
            return VendFailed(text)
        return AdapterError(text or "unspecified")
    raise ProtocolError(f"unknown adapter message {_shown(kind)} in {_shown(line)}")


def _parse_status(args: list[str], line: str, unit: AmountUnit) -> AdapterMessage:
    if not args:
        raise ProtocolError(f"STATUS without a state: {_shown(line)}")
    state = args[0].upper()
    if state == "VEND":
        if len(args) != 3:
            raise ProtocolError(
                f"vend request needs exactly an amount and a product: {_shown(line)}"
            )
        product = args[2]
        if not product:
            raise ProtocolError(f"vend request without a product: {_shown(line)}")
        return VendRequested(parse_amount(args[1], unit), product)
    try:
        status = ControllerStatus(state)
    except ValueError:
        raise ProtocolError(f"unknown status {_shown(args[0])} in {_shown(line)}") from None
    if len(args) > 2:
        raise ProtocolError(f"STATUS {status.value} takes at most one amount: {_shown(line)}")
    funds = parse_amount(args[1], unit) if len(args) > 1 and args[1] else None
    return StatusChanged(status, funds)


# -- what the agent says -----------------------------------------------------------------------


def setup_commands(address: int, *, enable: bool = True) -> list[str]:
    """Reset, configure and (unless out of service) enable the slave, on every (re)connect."""
    commands = [disable_reader(), f"C,SETCONF,mdb-addr=0x{address:02X}"]
    return [*commands, enable_reader()] if enable else commands


def enable_reader() -> str:
    """The cashless slave joins the bus: the controller polls and enables it."""
    return "C,1"


def disable_reader() -> str:
    """The cashless slave leaves the bus: the controller shows cashless unavailable."""
    return "C,0"


def approve_vend(cents: int, unit: AmountUnit = AmountUnit.DOLLARS) -> str:
    return f"C,VEND,{format_amount(cents, unit)}"


def deny_vend() -> str:
    return "C,STOP"


def start_session(funds_cents: int, unit: AmountUnit = AmountUnit.DOLLARS) -> str:
    return f"C,START,{format_amount(funds_cents, unit)}"


# -- what the controller side sees (used by the virtual controller) ----------------------------


@data_class(frozen=True, slots=True)
class AgentCommand:
    """A parsed ``C,...`` line, as the adapter/controller receives it."""

    verb: str  # "0", "1", "SETCONF", "VEND", "STOP", "START", "STATUS"
    amount_cents: int | None = None
    argument: str = ""


def parse_agent_line(line: str, unit: AmountUnit = AmountUnit.DOLLARS) -> AgentCommand:
    parts = line.strip().split(",")
    if parts[0] != "C" or len(parts) < 2:
        raise ProtocolError(f"not a cashless command: {_shown(line)}")
    verb = parts[1].upper()
    if verb in ("VEND", "START"):
        if len(parts) != 3:
            raise ProtocolError(f"{verb} needs an amount: {_shown(line)}")
        return AgentCommand(verb, parse_amount(parts[2], unit))
    if verb in ("0", "1", "STOP", "STATUS"):
        return AgentCommand(verb)
    if verb == "SETCONF":
        return AgentCommand(verb, argument=",".join(parts[2:]))
    raise ProtocolError(f"unknown cashless command {verb!r} in {_shown(line)}")


def status_line(status: ControllerStatus, funds_cents: int | None = None,
                unit: AmountUnit = AmountUnit.DOLLARS) -> str:
    if funds_cents is None:
        return f"c,STATUS,{status.value}"
    return f"c,STATUS,{status.value},{format_amount(funds_cents, unit)}"


def vend_request_line(cents: int, product: str, unit: AmountUnit = AmountUnit.DOLLARS) -> str:
    return f"c,STATUS,VEND,{format_amount(cents, unit)},{product}"


VEND_SUCCESS_LINE = "c,VEND,SUCCESS"
VEND_FAILED_LINE = f"c,ERR,{VEND_FAILED_CODE}"
