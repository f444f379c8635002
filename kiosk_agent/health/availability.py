"""Out of service, gracefully: whether each terminal can take a card now, and why not.

One place decides; every platform follows it. A terminal is *usable* while the journal takes
writes, the service answers and accepts the API key, and the terminal answers its ping online.
When one of those fails, the terminal stays in service for ``hold_off`` seconds (re-checked every
``recheck_interval`` meanwhile, so one lost ping does not take a reader off the bus); if it is
still unusable then, it goes *out of service*. It comes back at the first check that finds it
usable again, and while it is out of service that check runs every ``recheck_interval``.

Each change is journaled as an agent event (``out_of_service`` / ``in_service``, see
``sales.events.EventLog``), logged, shown in health (``Health.report_availability``) and handed to
the subscribers: the ``mdb`` cashless device disables itself on the bus, the ``gpio`` "available"
lamp goes off, the ``kiosk_api`` status says card payment is unavailable and why. A platform with
a sale in progress lets it finish and steps aside after it.

Starting is not an outage. An agent made with ``starting=True`` holds every terminal *starting*
until its readers are enabled (``readers_started``) and, after that, until the terminal is first
in service: whatever kept it out meanwhile (the journal read whole, the service unreachable at
boot, the terminal not answered yet) is told to the platforms and shown (``starting`` in health,
the page and the heartbeat) but journaled, logged and counted as no episode: every boot would
otherwise be one. A reason the terminal did not have when the readers were enabled ends the
start as an outage; once the terminal was in service, every reason is an outage as ever.

    availability.subscribe("SIM-0001", lambda state: print(state.available, state.reason))
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kiosk_agent.bus import EventBus
from kiosk_agent.data_class import data_class
from kiosk_agent.health.defaults import HOLD_OFF, RECHECK_INTERVAL
from kiosk_agent.moments import display_clock
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.states import SaleState

if TYPE_CHECKING:  # a platform's module (its configuration checked) need not import pydantic
    from kiosk_agent.health.model import Health
    from kiosk_agent.sales.events import EventLog

_LOGGER = logging.getLogger(__name__)

OUT_OF_SERVICE = "out_of_service"
IN_SERVICE = "in_service"

# Sale ends that hint the terminal or the service just failed: check again at once.
_SUSPECT_ENDS = frozenset({SaleState.FAILED, SaleState.ATTENTION})


@data_class(frozen=True, slots=True)
class TerminalState:
    """Whether card payment works on ``device_id`` now; ``reason`` says why not (for people)."""

    device_id: str
    available: bool
    reason: str = ""
    since: float = 0.0  # time.time() of the last change (or of the start)
    starting: bool = False  # out because the agent is starting: no outage

    def as_dict(self) -> dict[str, object]:
        return {
            "device_id": self.device_id,
            "available": self.available,
            "reason": self.reason,
            "since": self.since,
            "starting": self.starting,
        }


Listener = Callable[[TerminalState], None]


def unavailable_text(*, starting: bool, since: float, reason: str) -> str:
    """A terminal that cannot take cards, in the words of every command-line face
    (``kiosk-agent health``, the demo's live view): a start is no outage, and says so.
    ``STARTING since 10:15:30Z: journal: reading its file whole ...``; UTC, as every time
    the command line prints."""
    label = "STARTING" if starting else "OUT OF SERVICE"
    return f"{label} since {display_clock(since)}: {reason}"


FILE_CHECK_REASON = "journal: reading its file whole before money moves on it"

# What keeps a terminal out, each as (kind, text for people): the kind says whether a reason is
# one the start already had (its detail may change meanwhile: "service unreachable: ...").
Cause = tuple[str, str]


@data_class(slots=True)
class _Tracked:
    state: TerminalState
    failing_since: float | None = None  # monotonic: first check that found it unusable
    changes: int = 0
    changed_mono: float = 0.0  # monotonic: the last change, to say how long a state lasted
    # in service once since the readers were enabled: from then on, out is an outage
    ready: bool = False
    # the kinds of cause that kept it out when the readers were enabled: part of starting
    starting_kinds: frozenset[str] = frozenset()


class Availability:
    """Decides, from what `Health` holds, which terminals can take cards; tells the platforms."""

    def __init__(
        self,
        health: Health,
        device_ids: Sequence[str],
        *,
        resolve: Callable[[str | None], str] | None = None,
        hold_off: float = HOLD_OFF,
        recheck_interval: float = RECHECK_INTERVAL,
        log: EventLog | None = None,
        clock: Callable[[], float] = time.monotonic,
        starting: bool = False,
    ) -> None:
        """``starting``: the agent's readers are not enabled yet (``readers_started`` says when);
        until then a terminal out of service is starting, not in an outage."""
        self._health = health
        self._resolve = resolve
        self.hold_off = hold_off
        self.recheck_interval = recheck_interval
        self.log = log
        self._clock = clock
        now = time.time()
        self.readers_enabled = not starting
        self._tracked = {
            d: _Tracked(TerminalState(d, True, "", now), changed_mono=clock(), ready=not starting)
            for d in device_ids
        }
        self._listeners: dict[str, list[Listener]] = {d: [] for d in device_ids}
        self.changes: EventBus[TerminalState] = EventBus()
        self.listener_errors = 0
        self.wake: Callable[[], None] | None = None  # the checker's wake(), set by the agent
        self.stopping = ""  # why every terminal is out of service for good: the agent drains
        for tracked in self._tracked.values():
            self._report(tracked)

    # -- reading -------------------------------------------------------------------------------

    def device_id(self, terminal: str | None) -> str:
        """A configured terminal's device id from its id, its name or None (the default).

        Raises ``ValueError`` naming the configured ones when there is no such terminal."""
        if self._resolve is not None:
            return self._resolve(terminal)
        if terminal is None:
            if not self._tracked:
                raise ValueError("no terminal is configured")
            return next(iter(self._tracked))
        return terminal

    def state(self, terminal: str | None = None) -> TerminalState:
        """The terminal's state; one that is not configured can take no card, and says why."""
        try:
            device_id = self.device_id(terminal)
        except ValueError as err:
            return TerminalState(str(terminal), False, str(err), 0.0)
        tracked = self._tracked.get(device_id)
        if tracked is None:
            return TerminalState(device_id, False, f"terminal {device_id} is not configured", 0.0)
        return tracked.state

    def states(self) -> list[TerminalState]:
        return [t.state for t in self._tracked.values()]

    # -- following -----------------------------------------------------------------------------

    def subscribe(self, terminal: str | None, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` now with the current state, then at every change.

        Returns the function that unsubscribes it."""
        state = self.state(terminal)
        listeners = self._listeners.setdefault(state.device_id, [])
        listeners.append(listener)
        self._call(listener, state)

        def unsubscribe() -> None:
            if listener in listeners:
                listeners.remove(listener)

        return unsubscribe

    # -- deciding ------------------------------------------------------------------------------

    def reasons(self, device_id: str) -> list[str]:
        """Why ``device_id`` cannot take a card now, from the latest checks (empty: it can)."""
        return [text for _, text in self.causes(device_id)]

    def causes(self, device_id: str) -> list[Cause]:
        """``reasons`` with the kind of each: (kind, text)."""
        health = self._health
        causes: list[Cause] = [("stopping", self.stopping)] if self.stopping else []
        journal = health.journal
        if journal.writable is False:
            causes.append(("journal_not_writable", _with("journal not writable", journal.detail)))
        if journal.unwritten_sales:
            causes.append(("journal_unwritten",
                           f"journal: {len(journal.unwritten_sales)} sale(s) not written yet"))
        if journal.file_checking:
            causes.append(("journal_file_check", FILE_CHECK_REASON))
        if journal.file_damaged:
            causes.append(("journal_damaged", "journal damaged: a restart moves it aside"))
        if journal.charges_pending and journal.notice:
            # the journal was lost or damaged: no customer until reporting was compared with it
            causes.append(("journal_charges",
                           "journal: checking reporting for charges it does not hold"))
        if health.unit.mismatch:
            causes.append(("unit_mismatch", health.unit.mismatch))
        service = health.service
        if service.reachable is False:
            causes.append(("service_unreachable", _with("service unreachable", service.detail)))
        elif service.key_usable is False:
            causes.append(("key_refused", _with(
                "API key expired or refused and cannot be refreshed", service.key_detail)))
        terminal = health.terminal(device_id)
        if terminal is not None and terminal.online is False and service.reachable is not False:
            detail = "" if "offline" in terminal.detail else terminal.detail
            causes.append(("terminal_offline", _with("terminal offline", detail)))
        return causes

    def evaluate(self, *, at_start: bool = False) -> None:
        """Apply the latest checks (the checker calls this after each round).

        ``at_start``: no hold-off; a terminal found unusable before any reader was enabled
        starts out of service rather than stepping aside a moment later.
        """
        now = self._clock()
        # a journal fault takes every terminal out at once: no sale may start on a journal
        # that cannot hold it, not even during the hold-off
        at_start = at_start or self._journal_fault()
        for device_id, tracked in self._tracked.items():
            causes = self.causes(device_id)
            reason = "; ".join(text for _, text in causes)
            state = tracked.state
            if not causes:
                if tracked.failing_since is not None and state.available:
                    tracked.failing_since = None
                    self._report(tracked)  # the hold-off is over: its trouble no longer shown
                tracked.failing_since = None
                if not state.available:
                    self._change(tracked, True, "")
                tracked.ready = self.readers_enabled
                continue
            if self._still_starting(tracked, causes):
                self._wait_for_start(tracked, reason)
                continue
            if not state.available:
                if state.starting:
                    self._change(tracked, False, reason)  # the start's wait became an outage
                    continue
                if reason != state.reason:  # still out, for another reason: say the new one
                    tracked.state = TerminalState(device_id, False, reason, state.since)
                    self._report(tracked)
                    self._tell(tracked.state)
                continue
            if tracked.failing_since is None:
                tracked.failing_since = now
                if self.hold_off > 0:
                    _LOGGER.info("terminal %s unusable (%s): holding off %.1f s",
                                 device_id, reason, self.hold_off)
            if at_start or now - tracked.failing_since >= self.hold_off:
                self._change(tracked, False, reason)
            else:  # still in service, but health, the page and the CLI say it is failing
                self._report(tracked, failing=reason)

    def readers_started(self) -> None:
        """The agent enabled its readers: what keeps a terminal out now is still part of
        starting until it is first in service; anything else from now on is an outage."""
        self.readers_enabled = True
        for device_id, tracked in self._tracked.items():
            kinds = frozenset(kind for kind, _ in self.causes(device_id))
            tracked.starting_kinds = kinds if not tracked.ready else frozenset()
            tracked.ready = tracked.ready or (not kinds and tracked.state.available)
        self.evaluate()

    def stop_taking_cards(self, reason: str) -> None:
        """The agent is stopping: every terminal goes out of service now (no hold-off) and stays
        so; each platform refuses new customers as for any outage (the MDB reader leaves the
        bus once its session ends, the GPIO lamp goes off, the kiosk app is told)."""
        self.stopping = reason
        self.evaluate(at_start=True)

    def _journal_fault(self) -> bool:
        journal = self._health.journal
        return journal.writable is False or bool(journal.unwritten_sales) or (
            journal.file_checking or journal.file_damaged) or (
            journal.charges_pending and bool(journal.notice)
        ) or bool(self._health.unit.mismatch)

    def next_check_in(self, interval: float) -> float:
        """How long the checker may wait: ``interval``, shorter while anything is unusable."""
        now = self._clock()
        wait = interval
        for tracked in self._tracked.values():
            if not tracked.state.available:
                wait = min(wait, self.recheck_interval)
            elif tracked.failing_since is not None:
                left = tracked.failing_since + self.hold_off - now
                wait = min(wait, self.recheck_interval, max(0.05, left))
        return wait

    def on_sale_event(self, event: SaleEvent) -> None:
        """A sale that failed may mean the terminal just went away: have it checked now."""
        if event.state in _SUSPECT_ENDS and not event.receipt and self.wake is not None:
            self.wake()

    async def follow_sales(self, events: EventBus[SaleEvent]) -> None:
        # called as each step is published; only on a suspect end where the bus knows states
        await events.listen_until_cancelled(self.on_sale_event, kinds=_SUSPECT_ENDS)

    # -- inside --------------------------------------------------------------------------------

    def _still_starting(self, tracked: _Tracked, causes: list[Cause]) -> bool:
        """Out for what the start had: before the readers were enabled, anything; after,
        only the kinds it had then, until the terminal was once in service."""
        if tracked.ready:
            return False
        if not self.readers_enabled:
            return True
        return {kind for kind, _ in causes} <= tracked.starting_kinds

    def _wait_for_start(self, tracked: _Tracked, reason: str) -> None:
        """Out while the agent starts: the platforms hear it and health shows it, but no
        event, no count and no warning: a boot is no outage."""
        state = tracked.state
        if state.starting and state.reason == reason:
            return
        if not state.starting:
            _LOGGER.info("terminal %s waits for the start: %s", state.device_id, reason)
            tracked.changed_mono = self._clock()
        since = state.since if state.starting else time.time()
        tracked.state = TerminalState(state.device_id, False, reason, since, starting=True)
        tracked.failing_since = None
        self._report(tracked)
        self._tell(tracked.state)

    def _change(self, tracked: _Tracked, available: bool, reason: str) -> None:
        device_id = tracked.state.device_id
        was_starting = tracked.state.starting
        tracked.state = TerminalState(device_id, available, reason, time.time())
        # how long it was out: monotonic (the wall clock may have stepped meanwhile: NTP)
        now = self._clock()
        lasted, tracked.changed_mono = now - tracked.changed_mono, now
        tracked.failing_since = None
        if available and was_starting:  # the start is over: in service, no episode ended
            tracked.ready = self.readers_enabled
            _LOGGER.info("terminal %s in service after starting for %.1f s", device_id, lasted)
            self._report(tracked)
            self._tell(tracked.state)
            return
        if was_starting:  # the start became an outage: it ends as one, never as a start
            tracked.starting_kinds = frozenset()
        if not available:
            tracked.changes += 1
            _LOGGER.warning("terminal %s out of service: %s", device_id, reason)
        else:
            _LOGGER.info("terminal %s back in service after %.1f s", device_id, lasted)
        if self.log is not None:
            kind = IN_SERVICE if available else OUT_OF_SERVICE
            detail: dict[str, object] = {"reason": reason} if reason else {
                "out_of_service_s": round(lasted, 3)
            }
            self.log.record(kind, device_id, detail)
        self._report(tracked)
        self._tell(tracked.state)

    def _report(self, tracked: _Tracked, failing: str = "") -> None:
        state = tracked.state
        self._health.report_availability(
            state.device_id,
            available=state.available,
            reason=state.reason,
            since=state.since,
            changes=tracked.changes,
            failing=failing,
            starting=state.starting,
        )

    def _tell(self, state: TerminalState) -> None:
        self.changes.publish(state)
        for listener in list(self._listeners.get(state.device_id, ())):
            self._call(listener, state)

    def _call(self, listener: Listener, state: TerminalState) -> None:
        try:
            listener(state)
        except Exception:
            # one platform's bug must not keep the others from hearing
            self.listener_errors += 1
            _LOGGER.exception("availability listener failed (%d so far)", self.listener_errors)


_SHORT_MAX = 52  # the longest head: "API key expired or refused and cannot be refreshed"


def short_reason(reason: str) -> str:
    """Why not, short enough for a device's display line: ``out of service: terminal offline``.

    The first reason's head, without its detail (an exception's text may be long or hold any
    character); printable ASCII only, at most 52 characters after the prefix."""
    head = reason.split(";", 1)[0].split(":", 1)[0].strip()
    head = "".join(c for c in head if " " <= c <= "~")[:_SHORT_MAX].strip()
    return f"out of service: {head}" if head else "out of service"


def _with(what: str, detail: str) -> str:
    return f"{what}: {detail}" if detail else what


def follow_availability(
    agent: object, terminal: str | None, apply: Callable[[bool, str], None]
) -> Callable[[], None]:
    """Platform glue: ``apply(available, reason)`` now and at every change of ``terminal``.

    An agent without availability (a bare test rig) leaves the platform always available.
    Returns the unsubscribe function, for the platform's stop.
    """
    availability = getattr(agent, "availability", None)
    if not isinstance(availability, Availability):
        return lambda: None
    return availability.subscribe(terminal, lambda state: apply(state.available, state.reason))
