"""A person's decision on a sale in ATTENTION (``kiosk-agent sales resolve``, the admin API and
page): journaled with who and why, no money moved. Its own module, not the sweeper's
(sales/attention.py): a running agent imports it only with the admin API, which takes the
decisions (docs/architecture.md, "Idle memory: tenth round")."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from kiosk_agent.redact import redact
from kiosk_agent.sales import unit
from kiosk_agent.sales.journal import Journal, SaleMoved, SaleRecord
from kiosk_agent.sales.journal_reads import SaleNotFound
from kiosk_agent.sales.model import Flow, SaleEvent
from kiosk_agent.sales.states import RESOLUTIONS, SaleState, Step
from kiosk_agent.sales.steps import event_of
from kiosk_agent.text import control_character

if TYPE_CHECKING:
    from kiosk_agent.bus import EventBus

_LOGGER = logging.getLogger(__name__)

MAX_WHY = 500


class ResolveError(ValueError):
    """A resolution that cannot be applied: a bad ``as`` or reason."""


class UnknownSale(ResolveError):
    """No sale by that id, id prefix or order_id."""


class NotInAttention(ResolveError):
    """The sale is not (or no longer) in ATTENTION."""


def resolve(
    journal: Journal,
    sale_id: str,
    as_: str,
    why: str,
    by: str,
    events: EventBus[SaleEvent] | None = None,
) -> SaleRecord:
    """A person's decision on an ATTENTION sale, or on an open sale of another unit id
    (:func:`kiosk_agent.sales.unit.others_open`): what they did by hand, and why.

    Only journaled (no money moves here): ``captured`` ends the sale COMPLETED, ``reversed`` ends
    it REVERSED. The reason is kept with the sale, card numbers and secrets masked. Another
    unit's open sale is put in ATTENTION with why it is not this unit's, and resolved, in one
    transaction: its money stays that unit's, only the person's word is written.
    """
    if as_ not in RESOLUTIONS:
        raise ResolveError(f"--as must be one of {', '.join(RESOLUTIONS)}, got {as_!r}")
    why = " ".join(why.split())
    control = control_character(why)
    if control is not None:
        # a terminal escape or a right-to-left override would print as something else
        raise ResolveError(f"--why holds a control character ({control}); write plain text")
    if not why:
        raise ResolveError("say why: --why TEXT is kept with the sale")
    if len(why) > MAX_WHY:
        raise ResolveError(f"--why is {len(why)} characters; at most {MAX_WHY}")
    record = journal.get(sale_id) or find_sale(journal, sale_id)
    other = "" if record.state.final else unit.not_this_units(unit.rows(journal.db),
                                                              record.order_id)
    if record.state is not SaleState.ATTENTION and not other:
        raise NotInAttention(
            f"sale {record.sale_id} is {record.state.value}, not attention: nothing to resolve"
        )
    why = redact(why)
    resolution = {"as": as_, "why": why, "by": by, "at": round(journal.clock.time(), 3)}
    held = record.vended_cents or record.authorized_cents or record.amount_cents
    money = (
        {"captured_cents": record.captured_cents or held}
        if as_ == "captured"
        # given back: all the charge, also one partly refunded before (its part journaled)
        else {"reversed_cents": max(record.reversed_cents, record.captured_cents or held)}
    )
    if as_ != "captured" and record.flow == Flow.CHARGE_CARD:
        # a charge-card captures at once: what was given back had been charged, not held
        money["captured_cents"] = record.captured_cents or money["reversed_cents"]
    try:
        with journal.batch():
            if other:  # another unit's, open: put to the person it is, with why
                record = journal.record(record, Step.ATTENTION_RESOLVED, SaleState.ATTENTION,
                                        detail={"not_this_units": other}, message=other)
            resolved = _resolved(journal, record, as_, why, by, resolution, money)
    except SaleMoved as err:
        shown = err.state.value if err.state is not None else "gone"
        raise NotInAttention(
            f"sale {record.sale_id} is {shown}, not attention: nothing to resolve "
            "(someone resolved it a moment ago)"
        ) from None
    _LOGGER.info("sale %s resolved by %s as %s", resolved.sale_id, by, as_)
    if events is not None:
        events.publish(event_of(resolved, Step.ATTENTION_RESOLVED, clock=journal.clock))
    return resolved


def _resolved(
    journal: Journal, record: SaleRecord, as_: str, why: str, by: str,
    resolution: dict[str, object], money: dict[str, int],
) -> SaleRecord:
    return journal.record(
        record,
        Step.ATTENTION_RESOLVED,
        RESOLUTIONS[as_],
        detail={"as": as_, "why": why, "by": by},
        if_state=SaleState.ATTENTION,  # another process may have decided it since the read
        message=f"resolved by {by} as {as_}: {why}",
        resolution=json.dumps(resolution, sort_keys=True),
        **money,
    )


def find_sale(journal: Journal, wanted: str) -> SaleRecord:
    """A sale named by a unique prefix of its id (as the CLI prints them), or by its order_id."""
    try:
        return journal.find(wanted)
    except SaleNotFound as err:
        raise UnknownSale(str(err)) from None
