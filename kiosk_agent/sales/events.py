"""A small in-process publish/subscribe bus: sale steps and health changes, fanned out.

Subscribers get their own bounded queue so a slow live view can never stall a sale: when a
queue is full the oldest item is dropped and counted.

``EventLog`` keeps the agent's own events (out of service, back in service) durably, in the
journal's database beside the sales, and publishes each on its own bus.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, TypeVar

from kiosk_agent.bus import EventBus
from kiosk_agent.data_class import data_class
from kiosk_agent.redact import redact
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.sales.journal import transaction

_LOGGER = logging.getLogger(__name__)

T = TypeVar("T")


# -- the agent's own events, kept durably ----------------------------------------------------------

_EVENTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS agent_events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      REAL NOT NULL,
    kind    TEXT NOT NULL,
    subject TEXT NOT NULL,
    detail  TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS agent_events_at ON agent_events(at);
CREATE TABLE IF NOT EXISTS agent_probe (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    at REAL NOT NULL
);
"""

# Events that could not be written (the journal was not writable) wait here for the next write.
_MAX_UNWRITTEN = 1000


@data_class(frozen=True, slots=True)
class AgentEvent:
    """Something that happened to the agent itself, not to a sale (``out_of_service``, ...)."""

    kind: str
    subject: str  # what it happened to: a terminal's device id, a link's name
    at: float
    detail: Mapping[str, Any] = field(default_factory=dict)
    id: int | None = None  # None until written

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": self.at,
            "kind": self.kind,
            "subject": self.subject,
            "detail": dict(self.detail),
        }


class EventLog:
    """The agent's events in the journal's database (table ``agent_events``), beside the sales.

    ``record`` never raises: an event that cannot be written (a full disk, a read-only journal,
    which may be the very event being recorded) is kept in memory and written, with its own
    time, by the next write that works. ``probe`` is the checker's test that the journal takes a
    write: one committed row, replaced each time. Nothing here holds card data or secrets: the
    details are states, device ids and reasons, passed through ``redact``.
    """

    def __init__(
        self,
        db: Callable[[], sqlite3.Connection],
        clock: Clock = SYSTEM_CLOCK,
        gives_way: Callable[[], threading.Event | None] | None = None,
    ) -> None:
        self._db = db  # e.g. ``lambda: journal.db``: the journal's open connection
        self.clock = clock  # dates the events (wall time, for people)
        # asked before each write, as the journal's own writes ask (Journal.prune_gives_way):
        # a batch of the prune or an index's build under way in its worker thread rolls back,
        # where the write (on the event loop) waited it out with every request; the event it
        # returns is set once the write holds the lock
        self._gives_way = gives_way
        self._unwritten: list[AgentEvent] = []
        self.bus: EventBus[AgentEvent] = EventBus()
        self.lost = 0  # events dropped because too many waited to be written
        self._ready = False

    def open(self) -> None:
        """Create the tables (idempotent); the journal must be open."""
        self._db().executescript(_EVENTS_SCHEMA)
        self._ready = True

    def record(
        self, kind: str, subject: str, detail: Mapping[str, Any] | None = None
    ) -> AgentEvent:
        """Journal one event (or keep it until the journal takes writes) and publish it."""
        clean = {k: redact(v) if isinstance(v, str) else v for k, v in (detail or {}).items()}
        event = AgentEvent(kind=kind, subject=subject, at=self.clock.time(), detail=clean)
        self._unwritten.append(event)
        if len(self._unwritten) > _MAX_UNWRITTEN:
            del self._unwritten[0]
            self.lost += 1
        written = self._flush()
        published = written.get(id(event), event)
        self.bus.publish(published)
        return published

    @property
    def unwritten(self) -> int:
        return len(self._unwritten)

    def probe(self) -> None:
        """One committed write; raises (``sqlite3.Error``, ``JournalError``) when it fails."""
        db = self._db()
        if not self._ready:
            self.open()
        way_taken = self._gives_way() if self._gives_way is not None else None
        with transaction(db):
            if way_taken is not None:
                way_taken.set()
            db.execute("INSERT OR REPLACE INTO agent_probe (id, at) VALUES (1, ?)",
                       (self.clock.time(),))
        self._flush()

    def recent(self, limit: int = 50, kind: str | None = None) -> list[AgentEvent]:
        """The newest events first (written ones, then any still waiting to be written)."""
        where, args = ("WHERE kind = ?", (kind,)) if kind else ("", ())
        rows = self._db().execute(
            f"SELECT id, at, kind, subject, detail FROM agent_events {where}"  # noqa: S608
            " ORDER BY id DESC LIMIT ?",
            (*args, limit),
        )
        written = [
            AgentEvent(kind=r[2], subject=r[3], at=r[1], detail=json.loads(r[4]), id=r[0])
            for r in rows
        ]
        waiting = [e for e in reversed(self._unwritten) if kind is None or e.kind == kind]
        return (waiting + written)[:limit]

    def prune(self, keep_days: int, now: float | None = None) -> int:
        cutoff = (now if now is not None else self.clock.time()) - keep_days * 86400
        cursor = self._db().execute("DELETE FROM agent_events WHERE at < ?", (cutoff,))
        return cursor.rowcount

    def _flush(self) -> dict[int, AgentEvent]:
        """Write what waits, oldest first, in one transaction; {id(event): written event}."""
        if not self._unwritten:
            return {}
        written: dict[int, AgentEvent] = {}
        try:
            db = self._db()
            if not self._ready:
                self.open()
            way_taken = self._gives_way() if self._gives_way is not None else None
            with transaction(db):
                if way_taken is not None:
                    way_taken.set()
                for event in self._unwritten:
                    cursor = db.execute(
                        "INSERT INTO agent_events (at, kind, subject, detail) VALUES (?, ?, ?, ?)",
                        (event.at, event.kind, event.subject,
                         json.dumps(dict(event.detail), default=str, sort_keys=True)),
                    )
                    written[id(event)] = dataclasses.replace(event, id=cursor.lastrowid)
        except Exception as err:  # noqa: BLE001 - kept for the next write; the caller goes on
            _LOGGER.warning("%d agent event(s) not journaled yet: %s", len(self._unwritten), err)
            return {}
        self._unwritten.clear()
        return written
