"""Rules for text that came from outside and that a person reads later."""

from __future__ import annotations

import unicodedata


def control_character(text: str) -> str | None:
    """The first control character in ``text``, described (``U+001B``), or None.

    C0/C1 controls and the invisible format characters (Unicode ``Cc`` and ``Cf``: a terminal
    escape, a right-to-left override) have no place in a product name, a reason or a detail a
    person reads later: printed by the CLI or shown on the status page they would say something
    else than what is stored. The zero-width (non-)joiner is writing, not formatting: allowed.
    """
    if text.isprintable():  # holds no Cc or Cf character: no walk (most text, at C speed)
        return None
    for char in text:
        if unicodedata.category(char) in ("Cc", "Cf") and char not in _JOINERS:
            return f"U+{ord(char):04X}"
    return None


# Format characters that writing needs: Persian and Indic scripts, emoji sequences.
_JOINERS = frozenset("\u200c\u200d")


def for_terminal(text: str, *, keep_lines: bool = False) -> str:
    """``text`` as a terminal shows it and never obeys it, as the status page shows text: a
    control or invisible format character from outside (an escape sequence in a service's
    answer, a right-to-left override) becomes U+FFFD, a tab or line end a space (with
    ``keep_lines``, line ends stay: the command's own layout), the joiners writing needs stay."""
    if text.isprintable():  # no control, format or line character: shown as it is
        return text
    kept = "\n" if keep_lines else ""
    out = []
    for char in text:
        if char in kept or char in _JOINERS:
            out.append(char)
        elif char in "\t\r\n":
            out.append(" ")
        elif unicodedata.category(char) in ("Cc", "Cf"):
            out.append("\ufffd")
        else:
            out.append(char)
    return "".join(out)


def for_terminal_in(value: object) -> object:
    """Every string in a JSON-like ``value`` (keys too) as :func:`for_terminal` shows it: a
    report from outside (an agent's health, a unit's retained state) made safe to format for
    a terminal in one pass, whatever field of it the text then shows."""
    if isinstance(value, str):
        return for_terminal(value)
    if isinstance(value, dict):
        return {for_terminal_in(k): for_terminal_in(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [for_terminal_in(v) for v in value]
    return value
