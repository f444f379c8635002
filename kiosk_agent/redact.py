"""Masks card numbers, bearer tokens, API keys and secrets in any text: the last safety net.

Code must not log secrets in the first place; this catches what slips through (an exception that
echoes a request, a third-party library's debug line). Card numbers are recognised as 13-19 digit
runs, with or without spaces or dashes, that pass the Luhn check, so order ids and timestamps are
left alone. The first six and last four digits stay visible (PCI DSS allows that much).
"""

from __future__ import annotations

import functools
import logging
import re

MASK = "[REDACTED]"

# 13-19 digits, optionally grouped by single spaces or dashes; not part of a longer number.
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
# the names of secrets (not secrets themselves)
_SECRET_WORDS = "|".join(
    (
        r"api[_-]?key", r"refresh[_-]?token", r"access[_-]?token", "token", r"client[_-]?secret",
        "secret", "password", "passwd", "authorization", r"account[_-]?token", "cvn", "cvv",
        r"card[_-]?number", r"webhook[_-]?secret",
    )
)
# "key": "value" / 'key': 'value' (JSON, Python reprs)
_QUOTED = (
    rf"""(?ix)(["']?(?:[\w-]*?(?:{_SECRET_WORDS}))["']?\s*[:=]\s*)(["'])(?:(?!\2).)*\2"""
)
# key=value / key: value (query strings, form bodies, log text)
_PLAIN = (
    rf"(?i)(\b(?:[\w-]*?(?:{_SECRET_WORDS}))\s*[=:]\s*)"
    rf"(?![\"'\s]|(?:bearer|basic)\s|\[REDACTED\])[^\s&,;)}}\]]+"
)


@functools.cache
def _secret_values() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """_QUOTED and _PLAIN compiled, on the first text that names a secret: the two largest
    patterns here (1.4 ms of compiling at every start and every command that imports this
    module, for log lines that name none: a start's do not)."""
    return re.compile(_QUOTED), re.compile(_PLAIN)


# What both need somewhere in the text, looked for once: their lazy name prefix tries every
# word at every position of every run of letters and digits (190 us for the 70 characters of
# "sale <id> completed: paid $2.50 (captured)", a log line each sale at INFO), this 3 us.
# Where the text cannot begin a name (the first letters of the words, matched under the same
# flag, so a long s still counts as an s), no word is tried: most positions of a sale id and a
# price are digits and other letters (on the sale's line 18-19 us -> 5-7 us, load 2-3,
# 2026-11-29).
_NAME_STARTS = "".join(sorted({word[0] for word in _SECRET_WORDS.split("|")}))
_A_SECRET_WORD = re.compile(rf"(?i)(?=[{_NAME_STARTS}])(?:{_SECRET_WORDS})")


def luhn_valid(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if index % 2:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


def _mask_card(match: re.Match[str]) -> str:
    text = match.group(0)
    digits = re.sub(r"[ -]", "", text)
    if not luhn_valid(digits):
        return text
    return f"{digits[:6]}{'*' * (len(digits) - 10)}{digits[-4:]}"


def redact(text: str) -> str:
    """``text`` with card numbers, bearer/basic credentials and secret values masked."""
    if not text:
        return text
    text = _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", text)
    if _A_SECRET_WORD.search(text):  # else neither of the two below can match
        quoted, plain = _secret_values()
        text = quoted.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}{m.group(2)}", text)
        text = plain.sub(lambda m: f"{m.group(1)}{MASK}", text)
    return _CARD.sub(_mask_card, text)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts the final message (and exception text) of every record.

    Attach it to handlers: ``handler.addFilter(RedactingFilter())``. The record's message is
    formatted once here and its args cleared, so no formatter sees the raw values afterwards.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a bad format string must not lose the record
            message = f"{record.msg!r} {record.args!r}"
        record.msg = redact(message)
        record.args = None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def redirect_target(location: str | None) -> str:
    """Where a redirect pointed, fit to show: without its query or fragment (they may carry a
    token or a session), bounded, and redacted."""
    if not location:
        return "nowhere (no Location)"
    where = location.split("#", 1)[0].split("?", 1)[0]
    return redact(where[:200])
