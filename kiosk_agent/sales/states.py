"""Where a sale stands, the steps that move it, and the one table of allowed moves.

Every write of a sale goes through :func:`check_transition` (the journal calls it inside its
write transaction, against the state on disk), so the table below is the whole truth of how a
sale may move, for every code path, process and person:

- a state that is not final may take any step that keeps it (a note: an id, an amount, a
  retry); a move to another state must be in :data:`TRANSITIONS`;
- ``completed``, ``declined``, ``cancelled`` and ``reversed`` are final for good: nothing leaves
  them, and only a receipt note is added to a completed sale;
- ``attention`` is decided later, by the attention sweeper (what reporting shows) or by a
  person (``attention.resolved``), and only by their steps;
- ``failed`` is left once, by the late-charge net only (``late.found``), and only when the sale
  ended on "no charge was made" after a lost answer: a charge the service made later than it
  promised is then given back.

docs/journal.md draws this table; a test holds the drawing and the table to each other.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Collection, Mapping

from kiosk_agent.data_class import data_class


class SaleState(enum.StrEnum):
    """Where a sale stands; the journal stores these values."""

    STARTED = "started"
    READING_CARD = "reading_card"
    AUTHORIZING = "authorizing"
    CHARGING = "charging"
    DISPENSING = "dispensing"
    CAPTURING = "capturing"
    REVERSING = "reversing"  # void or refund under way
    ENROLLING = "enrolling"
    # a money call's answer was lost and reporting shows no charge yet: the service may still
    # answer it, so the sale looks again until the call's deadline (the journal's answer_by)
    UNRESOLVED = "unresolved"
    COMPLETED = "completed"  # paid and dispensed (or enrolled)
    DECLINED = "declined"  # no money moved
    CANCELLED = "cancelled"  # no money moved
    FAILED = "failed"  # no money moved (device fault, expiry, error before a charge)
    REVERSED = "reversed"  # money moved and was given back
    ATTENTION = "attention"  # could not be decided: the sweeper or a person decides later

    @functools.cached_property  # read on every step by many: kept on the member once known
    def final(self) -> bool:
        """The sale's flow has ended: recovery leaves it alone (attention included)."""
        return self in _FINAL


_FINAL = frozenset(
    {
        SaleState.COMPLETED,
        SaleState.DECLINED,
        SaleState.CANCELLED,
        SaleState.FAILED,
        SaleState.REVERSED,
        SaleState.ATTENTION,
    }
)


class Flow(enum.StrEnum):
    CHARGE_CARD = "charge_card"
    AUTHORIZE_CAPTURE = "authorize_capture"
    ENROLL = "enroll"


class Step(enum.StrEnum):
    """Every step name the journal stores (``steps.step``) and a ``SaleEvent`` announces."""

    CREATED = "created"
    # charge_card: one terminal call that reads the card and charges it
    CHARGE_CARD_REQUEST = "charge_card.request"
    CHARGE_CARD_RETRY = "charge_card.retry"
    CHARGE_CARD_ACCEPTED = "charge_card.accepted"
    CHARGE_CARD_ANSWER = "charge_card.answer"  # a B answer: ask again
    CHARGE_CARD_APPROVED = "charge_card.approved"
    CHARGE_CARD_DECLINED = "charge_card.declined"
    CHARGE_CARD_RETRIES = "charge_card.retries"
    CHARGE_CARD_BUSY = "charge_card.busy"
    CHARGE_CARD_REFUSED = "charge_card.refused"
    CHARGE_CARD_EXPIRED = "charge_card.expired"
    CHARGE_CARD_CANCELLED = "charge_card.cancelled"
    CHARGE_CARD_FAULT = "charge_card.fault"
    CHARGE_CARD_LOST = "charge_card.lost"
    CHARGE_CARD_WAITING = "charge_card.waiting"
    CHARGE_CARD_UNKNOWN = "charge_card.unknown"
    CHARGE_CARD_FOUND = "charge_card.found"
    CHARGE_CARD_REVERSED = "charge_card.reversed"
    CHARGE_CARD_NONE = "charge_card.none"
    # a card read (authorize_capture, enroll)
    READ_CARD_REQUEST = "read_card.request"
    READ_CARD_ACCEPTED = "read_card.accepted"
    READ_CARD_DONE = "read_card.done"
    READ_CARD_BUSY = "read_card.busy"
    # the terminal answered busy while a card read whose answer was lost may hold it: waiting
    TERMINAL_WAIT = "terminal.wait"
    READ_CARD_ERROR = "read_card.error"
    READ_CARD_TIMEOUT = "read_card.timeout"
    READ_CARD_CANCELLED = "read_card.cancelled"
    READ_CARD_EXPIRED = "read_card.expired"
    READ_CARD_FAULT = "read_card.fault"
    # authorize_capture: the authorization
    AUTHORIZE_REQUEST = "authorize.request"
    AUTHORIZE_RETRY = "authorize.retry"
    AUTHORIZE_ANSWER = "authorize.answer"
    AUTHORIZE_APPROVED = "authorize.approved"
    AUTHORIZE_DECLINED = "authorize.declined"
    AUTHORIZE_RETRIES = "authorize.retries"
    AUTHORIZE_REFUSED = "authorize.refused"
    AUTHORIZE_LOST = "authorize.lost"
    AUTHORIZE_WAITING = "authorize.waiting"
    AUTHORIZE_UNKNOWN = "authorize.unknown"
    AUTHORIZE_FOUND = "authorize.found"
    AUTHORIZE_REVERSED = "authorize.reversed"
    AUTHORIZE_NONE = "authorize.none"
    # the machine
    DISPENSE_REQUEST = "dispense.request"
    # card first: the customer's choice (product, price), journaled before its vend is approved
    DISPENSE_CHOSEN = "dispense.chosen"
    DISPENSE_RESULT = "dispense.result"  # a dispense that was not confirmed
    # money kept or given back
    CAPTURE_REQUEST = "capture.request"
    CAPTURE_FAILED = "capture.failed"
    CAPTURE_REFUSED = "capture.refused"
    CAPTURE_ABOVE = "capture.above_asked"  # the capture answered more than it asked to take
    COMPLETED = "completed"
    REVERSE_REQUEST = "reverse.request"
    REVERSE_DONE = "reverse.done"
    REVERSE_FAILED = "reverse.failed"
    REVERSE_UNKNOWN = "reverse.unknown"
    # enroll
    VAULT_REQUEST = "vault.request"
    VAULT_DONE = "vault.done"
    VAULT_FAILED = "vault.failed"
    PLAN_REQUEST = "plan.request"
    PLAN_DONE = "plan.done"
    PLAN_FAILED = "plan.failed"
    # around a running sale
    RECEIPT = "receipt"  # a receipt note on a completed sale (printed, mailed, or why not)
    CANCEL_REQUESTED = "cancel.requested"
    PARKED = "parked"  # the agent stopped mid-sale; the next start recovers it
    ERROR = "error"  # a bug ended the flow
    # recovery on start
    RECOVERY_START = "recovery.start"
    RECOVERY_DONE = "recovery.done"
    RECOVERY_UNDECIDED = "recovery.undecided"
    RECOVERY_ERROR = "recovery.error"
    RECOVERY_CHARGED = "recovery.charged"
    RECOVERY_WAITING = "recovery.waiting"
    RECOVERY_UNKNOWN = "recovery.unknown"
    RECOVERY_FOUND = "recovery.found"
    RECOVERY_REVERSED = "recovery.reversed"
    RECOVERY_NONE = "recovery.none"
    # later: the attention sweeper, a person, the late-charge net
    ATTENTION_RECHECK = "attention.recheck"  # a money call the sweeper makes
    ATTENTION_FOUND = "attention.found"
    ATTENTION_DONE = "attention.done"
    ATTENTION_RESOLVED = "attention.resolved"  # a person's decision
    LATE_FOUND = "late.found"
    # a note: the machine reported the vend after the sale gave up waiting (sales/late_vends.py)
    LATE_VEND = "late.vend"
    LATE_VEND_SEEN = "late.vend.seen"  # a note: a person acknowledged it
    # the journal's disk failed (sales/journal_guard.py, sales/unwritten.py, sales/audit.py)
    JOURNAL_UNWRITTEN = "journal.unwritten"  # an event only: the step could not be written
    JOURNAL_RESTORED = "journal.restored"  # the sale as memory held it, written again
    AUDIT_FOUND = "audit.found"  # a charge in reporting the journal did not hold
    AUDIT_UNDECIDED = "audit.undecided"  # too many such at once: a person looks
    # a note: the charge check found the sale's charge voided, refunded or charged back at the
    # service after the sale ended, by someone else (sales/audit.py, ``LaterGiveBacks``)
    SERVICE_LATER = "service.later"


@data_class(frozen=True, slots=True)
class ReportingSteps:
    """The steps of one kind of "did money move?" question asked of reporting after a lost
    answer or a crash (``SaleSteps.settle_by_reporting``)."""

    lost: Step | None  # the answer was lost (None: a crash, not a lost answer)
    waiting: Step  # no charge yet; the service may still answer: UNRESOLVED
    unknown: Step  # reporting cannot say after the deadline: ATTENTION
    found: Step  # a charge found: it is given back
    reversed: Step  # a charge already given back: REVERSED
    none: Step  # no charge in a lookup sent after the deadline: FAILED


CHARGE_CARD_REPORTING = ReportingSteps(
    Step.CHARGE_CARD_LOST,
    Step.CHARGE_CARD_WAITING,
    Step.CHARGE_CARD_UNKNOWN,
    Step.CHARGE_CARD_FOUND,
    Step.CHARGE_CARD_REVERSED,
    Step.CHARGE_CARD_NONE,
)
AUTHORIZE_REPORTING = ReportingSteps(
    Step.AUTHORIZE_LOST,
    Step.AUTHORIZE_WAITING,
    Step.AUTHORIZE_UNKNOWN,
    Step.AUTHORIZE_FOUND,
    Step.AUTHORIZE_REVERSED,
    Step.AUTHORIZE_NONE,
)
RECOVERY_REPORTING = ReportingSteps(
    None,
    Step.RECOVERY_WAITING,
    Step.RECOVERY_UNKNOWN,
    Step.RECOVERY_FOUND,
    Step.RECOVERY_REVERSED,
    Step.RECOVERY_NONE,
)

# The steps that send a money call (and write its answer_by with it).
# what a person says happened to a sale in attention -> the state it ends the sale in
# (`kiosk-agent sales resolve --as`, sales.resolve.resolve)
RESOLUTIONS: Mapping[str, SaleState] = {
    "captured": SaleState.COMPLETED, "reversed": SaleState.REVERSED,
}

REQUEST_STEPS = frozenset({Step.CHARGE_CARD_REQUEST, Step.AUTHORIZE_REQUEST})
# The steps that end a sale on "reporting showed no charge by the deadline": the only FAILED
# sales the late-charge net reopens.
NO_CHARGE_STEPS = frozenset(
    r.none for r in (CHARGE_CARD_REPORTING, AUTHORIZE_REPORTING, RECOVERY_REPORTING)
)

# A step that may leave a final state, and the last steps it may follow: the late-charge net
# reopens only a sale that ended on "no charge" after a lost answer.
REOPENED_AFTER: Mapping[Step, frozenset[Step]] = {Step.LATE_FOUND: NO_CHARGE_STEPS}

S = SaleState
# a product dispensed after its sale gave up waiting, and a person's acknowledgement: notes on
# the sale in whatever state it is (they change none of its fields)
_LATE_VEND_NOTES = frozenset({Step.LATE_VEND, Step.LATE_VEND_SEEN})
# what the service holds now of a completed sale's charge, given back by others after it ended:
# the only fields a note on a settled sale sets (Step.SERVICE_LATER); what the agent captured
# and gave back stays as it was
LATER_FIELDS = frozenset({"later"})
ANY_STEP = None  # an edge any step may take
_Edges = Mapping[SaleState, frozenset[Step] | None]

# The one table: from a state, the states a write may move a sale to, and by which steps
# (ANY_STEP: any). A state not final may also take any step that keeps it (not listed).
TRANSITIONS: Mapping[SaleState, _Edges] = {
    S.STARTED: dict.fromkeys((S.CHARGING, S.READING_CARD, S.FAILED, S.ATTENTION)),
    S.READING_CARD: dict.fromkeys(
        (S.AUTHORIZING, S.ENROLLING, S.FAILED, S.CANCELLED, S.ATTENTION)
    ),
    S.CHARGING: dict.fromkeys(
        (S.DISPENSING, S.UNRESOLVED, S.REVERSING, S.REVERSED, S.DECLINED, S.CANCELLED,
         S.FAILED, S.ATTENTION)
    ),
    S.AUTHORIZING: dict.fromkeys(
        (S.DISPENSING, S.UNRESOLVED, S.REVERSING, S.REVERSED, S.DECLINED, S.FAILED,
         S.ATTENTION)
    ),
    S.UNRESOLVED: dict.fromkeys(
        (S.REVERSING, S.REVERSED, S.DECLINED, S.CANCELLED, S.FAILED, S.ATTENTION)
    ),
    S.DISPENSING: dict.fromkeys((S.COMPLETED, S.CAPTURING, S.REVERSING, S.ATTENTION)),
    S.CAPTURING: dict.fromkeys((S.COMPLETED, S.ATTENTION)),
    S.REVERSING: dict.fromkeys((S.REVERSED, S.ATTENTION)),
    S.ENROLLING: dict.fromkeys((S.COMPLETED, S.FAILED, S.ATTENTION)),
    # decided by the sweeper (from what reporting shows) or by a person
    S.ATTENTION: {
        S.ATTENTION: frozenset({Step.ATTENTION_RECHECK, Step.ATTENTION_FOUND,
                                Step.REVERSE_UNKNOWN, Step.JOURNAL_RESTORED, *_LATE_VEND_NOTES}),
        S.REVERSING: frozenset({Step.REVERSE_REQUEST}),
        S.CAPTURING: frozenset({Step.CAPTURE_REQUEST}),
        S.COMPLETED: frozenset({Step.ATTENTION_DONE, Step.ATTENTION_RESOLVED}),
        S.REVERSED: frozenset({Step.ATTENTION_DONE, Step.ATTENTION_RESOLVED}),
        S.FAILED: frozenset({Step.ATTENTION_DONE}),
    },
    # reopened by the late-charge net only, after a NO_CHARGE_STEPS end
    S.FAILED: {S.REVERSING: frozenset({Step.LATE_FOUND}), S.FAILED: _LATE_VEND_NOTES},
    S.COMPLETED: {S.COMPLETED: frozenset({Step.RECEIPT, Step.SERVICE_LATER, *_LATE_VEND_NOTES})},
    S.DECLINED: {S.DECLINED: _LATE_VEND_NOTES},
    S.CANCELLED: {S.CANCELLED: _LATE_VEND_NOTES},
    S.REVERSED: {S.REVERSED: _LATE_VEND_NOTES},
}

# Final states whose facts are settled (attention's are still being found out): a step that
# keeps them is a note and changes none of the sale's fields.
_SETTLED = _FINAL - {SaleState.ATTENTION}

# The one state a sale is created in.
INITIAL = SaleState.STARTED

# The states a sale of each flow may be in (a move to another is refused).
_ENDS = frozenset(s for s in SaleState if s.final)
FLOW_STATES: Mapping[Flow, frozenset[SaleState]] = {
    Flow.CHARGE_CARD: frozenset(
        {S.STARTED, S.CHARGING, S.UNRESOLVED, S.DISPENSING, S.REVERSING} | _ENDS
    ),
    Flow.AUTHORIZE_CAPTURE: frozenset(
        {S.STARTED, S.READING_CARD, S.AUTHORIZING, S.UNRESOLVED, S.DISPENSING, S.CAPTURING,
         S.REVERSING} | _ENDS
    ),
    Flow.ENROLL: frozenset({S.STARTED, S.READING_CARD, S.ENROLLING} | _ENDS),
}


class TransitionRefused(Exception):
    """A write the table does not allow: it was not made (nothing of it reached the disk)."""

    def __init__(
        self, sale_id: str, current: SaleState | None, wanted: SaleState, step: str, why: str
    ) -> None:
        shown = current.value if current is not None else "(new)"
        super().__init__(
            f"sale {sale_id}: {shown} -> {wanted.value} by {step!r} refused: {why}"
        )
        self.sale_id = sale_id
        self.current = current
        self.wanted = wanted
        self.step = step


def check_transition(
    sale_id: str,
    flow: str,
    current: SaleState | None,
    wanted: SaleState,
    step: Step | str,
    last_step: str | None = None,
    changed: Collection[str] = (),
) -> Step:
    """The one check every write of a sale goes through; the step as a :class:`Step`.

    ``current`` is the state on disk (None: the sale is being created), ``last_step`` the name
    of its newest step, ``changed`` the fields the write sets besides its state. Raises
    :class:`TransitionRefused` naming the sale, both states and why.
    """

    def refuse(why: str) -> TransitionRefused:
        return TransitionRefused(sale_id, current, wanted, str(step), why)

    try:
        named = step if type(step) is Step else Step(step)  # an Enum call costs a write 1 us
    except ValueError:
        raise refuse("not a journal step") from None
    states = _STATES_BY_FLOW.get(flow) if isinstance(flow, str) else None
    if states is None:
        raise refuse(f"unknown flow {flow!r}")
    if wanted not in states:
        raise refuse(f"a {flow} sale is never {wanted.value}")
    if current is None:
        if wanted is not INITIAL or named is not Step.CREATED:
            raise refuse(f"a sale is created {INITIAL.value}, by {Step.CREATED.value!r}")
        return named
    edges = TRANSITIONS[current]
    if wanted not in edges:
        if wanted is current and not current.final:
            return named  # a note on a running sale
        raise refuse(_no_edge(current))
    steps = edges[wanted]
    if steps is not ANY_STEP and named not in steps:
        allowed = ", ".join(sorted(steps))
        raise refuse(f"only by {allowed}")
    if named in REOPENED_AFTER and last_step not in REOPENED_AFTER[named]:
        raise refuse("the late-charge net reopens only a sale that ended on no charge")
    if (wanted is current and current in _SETTLED and changed
            and not (named is Step.SERVICE_LATER and set(changed) <= LATER_FIELDS)):
        # a receipt note on a completed sale must not rewrite what it took or gave back
        fields = ", ".join(sorted(changed))
        raise refuse(f"{current.value} is final: a note changes none of its fields ({fields})")
    return named


# FLOW_STATES by the flow's name as the journal stores it (a Flow is that str too)
_STATES_BY_FLOW: dict[str, frozenset[SaleState]] = {
    flow.value: states for flow, states in FLOW_STATES.items()
}


def _no_edge(current: SaleState) -> str:
    if current.final and not [to for to in TRANSITIONS[current] if to is not current]:
        return f"{current.value} is final"
    return f"not a move from {current.value}"


def allowed_moves() -> list[tuple[SaleState, SaleState, frozenset[Step] | None]]:
    """Every listed edge of the table as (from, to, steps or ANY_STEP), in a stable order."""
    order = list(SaleState)
    return [
        (source, target, steps)
        for source in order
        for target, steps in sorted(TRANSITIONS[source].items(), key=lambda e: order.index(e[0]))
    ]
