"""Text from outside, as a person reads it later (kiosk_agent/text.py)."""

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from kiosk_agent.text import control_character, for_terminal

JOINERS = "\u200c\u200d"


def _walked_control(text: str) -> str | None:
    """The rule, character by character, as the functions read before their quick look."""
    for char in text:
        if unicodedata.category(char) in ("Cc", "Cf") and char not in JOINERS:
            return f"U+{ord(char):04X}"
    return None


@given(st.text(), st.booleans())
def test_the_quick_look_changes_nothing_the_walk_would_say(text: str, keep_lines: bool) -> None:
    """Printable text is neither walked nor changed (a fleet of 10,000 units' rows was a
    million unicodedata lookups); whatever else comes, the answer is the walk's."""
    assert control_character(text) == _walked_control(text)
    shown = for_terminal(text, keep_lines=keep_lines)
    if text.isprintable():
        assert shown == text
    assert _walked_control(shown.replace("\n", "") if keep_lines else shown) is None
    assert len(shown) == len(text)
