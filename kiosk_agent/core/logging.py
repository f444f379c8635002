"""Structured logs: one line per record, as text for people or JSON for log shippers.

Every handler carries ``kiosk_agent.redact.RedactingFilter``: code must not log card data or
secrets, and the filter is the net under that rule, not the rule itself.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import sys
from pathlib import Path
from typing import IO, Any

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
        handler = logging.handlers.RotatingFileHandler(path, maxBytes=5_000_000, backupCount=3)
    else:
        handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(RedactingFilter())
    if conf.get("format", "text") == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == _HANDLER_NAME:  # set up again (tests, reload): replace, not add
            root.removeHandler(old)
            old.close()
    handler.set_name(_HANDLER_NAME)
    root.addHandler(handler)
    root.setLevel(conf.get("level", "INFO"))
    # aiohttp's access log would repeat every admin request at INFO
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return handler
