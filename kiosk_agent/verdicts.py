"""What a check says: its verdict, its detail and the fix, gathered in a report.

The doctor's words (``kiosk-agent doctor``, the status page's doctor), shared by every check
wherever it lives (beside what it checks: ``platforms/serial_doctor.py``, ``platforms/doctor.py``,
``sales/journal_doctor.py``, ``fleet/doctor.py``); ``doctor.py`` runs them. It imports nothing
of theirs, so each can import it.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class Verdict(enum.StrEnum):
    PASS = "PASS"  # noqa: S105 - a verdict, not a password
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(slots=True)
class Check:
    name: str
    verdict: Verdict
    detail: str = ""
    fix: str = ""
    notes: list[str] = field(default_factory=list)  # more lines, e.g. each config mistake

    def lines(self) -> list[str]:
        text = f"[{self.verdict}] {self.name}" + (f": {self.detail}" if self.detail else "")
        fix = [f"       fix: {self.fix}"] if self.fix else []
        return [text, *fix, *(f"       {note}" for note in self.notes)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict.value,
            "detail": self.detail,
            "fix": self.fix,
            "notes": list(self.notes),
        }


@dataclass(slots=True)
class Report:
    """The checks in the order they ran; ``on_check`` sees each one as it is added."""

    checks: list[Check] = field(default_factory=list)
    on_check: Callable[[Check], None] | None = None
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    def add(
        self,
        name: str,
        verdict: Verdict,
        detail: str = "",
        fix: str = "",
        notes: list[str] | None = None,
    ) -> Check:
        check = Check(name, verdict, detail, fix, notes or [])
        self.checks.append(check)
        if self.on_check is not None:
            self.on_check(check)
        return check

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.verdict is Verdict.FAIL]

    def as_dict(self) -> dict[str, Any]:
        return {
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "failed": len(self.failed),
            "checks": [c.as_dict() for c in self.checks],
        }
