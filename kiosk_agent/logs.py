"""Structured logs: one line per record, as text for people or JSON for log shippers.

Refusals an outsider can repeat (forged webhooks, bad tokens, a vend during a session) go through
:class:`RefusalLog`: the first few lines, then a count per interval, each counted for /metrics.

Every handler carries ``kiosk_agent.redact.RedactingFilter``: code must not log card data or
secrets, and the filter is the net under that rule, not the rule itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any, Protocol

from kiosk_agent.redact import RedactingFilter, redact

_HANDLER_NAME = "kiosk-agent"
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
# Attributes every LogRecord has; anything else was passed with ``extra=`` and is kept.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", ...extra, "exc"}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value if isinstance(value, (int, float, bool)) else redact(str(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(self.formatException(record.exc_info))
        if record.exc_text:
            data["exc"] = record.exc_text
        return json.dumps(data, default=str)


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT``'s line, made in one call: ``logging.Formatter`` made it in seven (its
    time and message helpers, its style object), and a unit writes one at each sale's end. The
    time of day is made once a second (``localtime`` and ``strftime``), the milliseconds at
    each line. The same text as ``logging.Formatter(TEXT_FORMAT)``, exception and stack
    included (tests/test_logs.py holds it to that)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        # (the second, its time of day): one attribute, so that two threads formatting at once
        # never pair one second with another's text
        self._kept: tuple[int, str] = (-1, "")

    def format(self, record: logging.LogRecord) -> str:
        # the handler's RedactingFilter leaves the final text in msg and no args: no second
        # %-formatting (getMessage) when it ran
        message = record.msg if record.args is None and isinstance(record.msg, str) else None
        record.message = message = record.getMessage() if message is None else message
        second, stamp = self._kept
        if int(record.created) != second:
            second = int(record.created)
            stamp = time.strftime(self.default_time_format, self.converter(record.created))
            self._kept = (second, stamp)
        record.asctime = f"{stamp},{int(record.msecs):03d}"
        line = f"{record.asctime} {record.levelname:<7} {record.name}: {message}"
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line = _joined(line, record.exc_text)
        if record.stack_info:
            line = _joined(line, self.formatStack(record.stack_info))
        return line


def _joined(line: str, more: str) -> str:
    """``more`` on the lines after ``line``, as ``logging.Formatter`` appends a traceback."""
    return line + more if line.endswith("\n") else f"{line}\n{more}"


class _StreamLines(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler whose line is formatted, written and flushed in one call: the flush
    takes no lock of its own, as ``emit`` runs under ``handle``'s (three calls fewer a line)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = (self.formatter or _PLAIN_FORMATTER).format(record)
            stream = self.stream
            stream.write(line + self.terminator)
            flush = getattr(stream, "flush", None)
            if flush is not None:
                flush()
        except RecursionError:  # as logging's own: a recursion is not a logging error
            raise
        except Exception:  # noqa: BLE001  # logging's own: said on stderr, the process goes on
            self.handleError(record)


_PLAIN_FORMATTER = logging.Formatter()


def setup_logging(
    conf: dict[str, Any] | None = None, *, stream: IO[str] | None = None
) -> logging.Handler:
    """Configure the root logger from the ``logging`` section; return the handler installed."""
    conf = conf or {}
    handler: logging.Handler
    if conf.get("file"):
        path = Path(conf["file"])
        path.parent.mkdir(parents=True, exist_ok=True)
        # bounded: a kiosk's flash must not fill up with logs over the years
        from logging.handlers import RotatingFileHandler  # only for a log file, seldom

        handler = RotatingFileHandler(path, maxBytes=5_000_000, backupCount=3)
    else:
        handler = _StreamLines(stream or sys.stderr)
    handler.addFilter(RedactingFilter())
    if conf.get("format", "text") == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == _HANDLER_NAME:  # set up again (tests, reload): replace, not add
            root.removeHandler(old)
            old.close()
    handler.set_name(_HANDLER_NAME)
    root.addHandler(handler)
    root.setLevel(conf.get("level", "INFO"))
    _gather_only_what_is_shown()
    # aiohttp's access log would repeat every admin request at INFO
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return handler


def _gather_only_what_is_shown() -> None:
    """Neither format shows where a line was logged from, its thread or its process: a record
    no longer looks them up (the switches of logging's own "Optimization" section). Walking the
    caller's frames, the current thread and the process id were a third of the calls of a line
    at INFO, which a unit writes at every sale's end."""
    logging._srcfile = None  # documented: no findCaller()
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


# -- repeated refusals -----------------------------------------------------------------------

# (source, reason) -> how many refusals since the process started; read by /metrics.
_REFUSALS: Counter[tuple[str, str]] = Counter()
# source -> lines not written one by one (they went into a summary); read by /metrics.
_SUPPRESSED: Counter[str] = Counter()


def refusal_counts() -> dict[tuple[str, str], int]:
    """Every refusal counted by a :class:`RefusalLog` so far, by (source, reason)."""
    return dict(_REFUSALS)


def suppressed_counts() -> dict[str, int]:
    """Log lines folded into summaries so far, by source."""
    return dict(_SUPPRESSED)


class LogClock(Protocol):
    """What a RefusalLog asks of time (``sales.clock.Clock`` has it; not imported here: the
    sale package logs through this module)."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class _MachineClock:
    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


_MACHINE_CLOCK = _MachineClock()


class RefusalLog:
    """Log a refusal that an outsider can repeat at will (forged webhooks, bad tokens, ...).

    The first ``first`` lines of each ``interval`` are written as usual; the rest of that
    interval are counted and written as one summary line when it ends ("N more ... by reason").
    Every refusal is counted per (source, reason) for ``/metrics``, logged or not, so a flood
    can neither rotate the log away nor hide. ``reason`` must come from a small fixed set (it
    is a metrics label); the details go in the message.
    """

    def __init__(
        self,
        logger: logging.Logger,
        source: str,
        *,
        first: int = 5,
        interval: float = 60.0,
        level: int = logging.WARNING,
        clock: LogClock | None = None,
        what: str = "refusal(s)",
    ) -> None:
        """``clock``: the intervals and the wait for the summary line run on its monotonic time
        (an agent's ``sales.clock.Clock``; the machine's by default)."""
        self.logger = logger
        self.what = what  # what the summary line counts
        self.source = source
        self.first = first
        self.interval = interval
        self.level = level
        self._clock = clock or _MACHINE_CLOCK
        self._window_start = -math.inf
        self._logged = 0
        self._held: Counter[str] = Counter()
        self._flush_task: asyncio.Task[None] | None = None

    def __call__(self, reason: str, msg: str, *args: Any, level: int | None = None) -> None:
        _REFUSALS[(self.source, reason)] += 1
        now = self._clock.monotonic()
        if now - self._window_start >= self.interval:
            self.flush()
            self._window_start, self._logged = now, 0
        if self._logged < self.first:
            self._logged += 1
            self.logger.log(self.level if level is None else level, msg, *args)
            return
        _SUPPRESSED[self.source] += 1
        self._held[reason] += 1
        if self._flush_task is None:
            self._schedule_flush(self._window_start + self.interval - now)

    def _schedule_flush(self, delay: float) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a thread, a script): the next call or flush() writes the summary
        self._flush_task = asyncio.ensure_future(self._flush_after(max(delay, 0.0)))

    async def _flush_after(self, delay: float) -> None:
        await self._clock.sleep(delay)
        self._flush_task = None  # done: flush() has no timer left to cancel
        self.flush()

    def flush(self) -> None:
        """Write the summary of what this interval held back (nothing when nothing was)."""
        if self._flush_task is not None:
            self._flush_task.cancel()
            self._flush_task = None
        if not self._held:
            return
        total = sum(self._held.values())
        by_reason = ", ".join(f"{reason} {count}" for reason, count in self._held.most_common())
        self._held.clear()
        self.logger.log(
            self.level,
            "%s: %d more %s in the last %g s, not logged one by one (%s)",
            self.source,
            total,
            self.what,
            self.interval,
            by_reason,
        )
