"""redact() masks what must never reach a log; RedactingFilter applies it to every record."""

from __future__ import annotations

import io
import logging
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiosk_agent import redact as redact_module
from kiosk_agent.redact import MASK, RedactingFilter, luhn_valid, redact, redirect_target
from tests.helpers import in_a_fresh_python

VISA = "4111111111111111"  # a Luhn-valid test number


@pytest.mark.parametrize(
    "text",
    [
        f"card {VISA} approved",
        "card 4111 1111 1111 1111 approved",
        "card 4111-1111-1111-1111 approved",
        "amex 378282246310005 approved",  # 15 digits
        "card 6011000990139424",
    ],
)
def test_card_numbers_are_masked_to_first_six_and_last_four(text: str) -> None:
    masked = redact(text)
    digits = "".join(c for c in text if c.isdigit())
    assert digits not in masked.replace(" ", "").replace("-", "")
    assert f"{digits[:6]}{'*' * (len(digits) - 10)}{digits[-4:]}" in masked


@pytest.mark.parametrize(
    "text",
    [
        "order 1234567890123 failed",  # 13 digits, not Luhn-valid
        "at 1732262400123 ms",
        "trans_id 100000000000000001",
        "amount 1250 cents",
    ],
)
def test_numbers_that_are_not_cards_stay(text: str) -> None:
    assert redact(text) == text


def test_luhn() -> None:
    assert luhn_valid(VISA)
    assert not luhn_valid("4111111111111112")


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Authorization: Bearer sim_api_key.abc-123", "sim_api_key.abc-123"),
        ("authorization=Basic c2ltX2NsaWVudDpzaW1fc2VjcmV0", "c2ltX2NsaWVudDpzaW1fc2VjcmV0"),
        ('{"api_key": "key_live_1", "amount": 100}', "key_live_1"),
        ('{"refresh_token":"rt_9"}', "rt_9"),
        ("{'client_secret': 'sim_secret'}", "sim_secret"),
        ("GET /cable?token=wst_123&x=1", "wst_123"),
        ("refresh_token=rt_1 api_key=k_2", "rt_1"),
        ("x-api-key: k_3", "k_3"),
        ("password=hunter2", "hunter2"),
        ('{"account_token": "tok_abc"}', "tok_abc"),
    ],
)
def test_secrets_in_key_value_and_json_forms_are_masked(text: str, secret: str) -> None:
    masked = redact(text)
    assert secret not in masked
    assert MASK in masked


def test_neighbouring_fields_survive() -> None:
    masked = redact('{"api_key": "k1", "mid": "999000000001", "api_key_expires_at": 17}')
    assert '"mid": "999000000001"' in masked
    assert '"api_key_expires_at": 17' in masked
    assert redact("GET /x?token=t1&mid=42") == f"GET /x?token={MASK}&mid=42"


def _logger_with_filter() -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("test_redact")
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, stream


def test_filter_masks_arguments_and_exceptions() -> None:
    logger, stream = _logger_with_filter()
    logger.info("charging %s with %s", VISA, "Bearer abc.def")
    try:
        raise ValueError(f"bad card {VISA} token=xyz")
    except ValueError:
        logger.exception("failed")
    out = stream.getvalue()
    assert VISA not in out
    assert "abc.def" not in out
    assert "xyz" not in out
    assert "411111******1111" in out
    assert "ValueError" in out


def test_filter_keeps_a_record_with_a_bad_format_string() -> None:
    logger, stream = _logger_with_filter()
    logger.info("two %s %s", VISA)  # one argument short
    out = stream.getvalue()
    assert out  # logged, not lost
    assert VISA not in out


@pytest.mark.parametrize(
    ("location", "shown"),
    [
        ("https://elsewhere.example/cable?token=wst-1", "https://elsewhere.example/cable"),
        ("https://elsewhere.example/pay#session=s", "https://elsewhere.example/pay"),
        ("/login?next=/api", "/login"),
        (None, "nowhere (no Location)"),
        ("", "nowhere (no Location)"),
    ],
)
def test_a_redirect_target_is_shown_without_its_query(location: str | None, shown: str) -> None:
    assert redirect_target(location) == shown


def _every_pattern(text: str) -> str:
    """redact as it was: all four patterns run on every text, whatever it holds."""
    if not text:
        return text
    text = redact_module._BEARER.sub(lambda m: f"{m.group(1)} {MASK}", text)
    quoted, plain = redact_module._secret_values()
    text = quoted.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}{m.group(2)}", text)
    text = plain.sub(lambda m: f"{m.group(1)}{MASK}", text)
    return redact_module._CARD.sub(redact_module._mask_card, text)


# the pieces a log line or a request's echo is made of, secret names in odd cases and forms
# (a long s and a Kelvin sign match s and k where case is ignored) among them
PIECES = st.sampled_from(
    ["token", "TOKEN", "api_key", "Api-Key", "apiKey", "client_secret", "paſſword", "\u212aey",
     "CVV", "cvn", "card-number", "Authorization", "bearer", "Basic", "=", ":", " ", '"', "'",
     "4111 1111 1111 1111", "sale", "1881884ee6254b89", "$2.50", ",", "&", "{", "}", "é"]
)  # fmt: skip


@settings(max_examples=300)
@given(st.lists(st.one_of(PIECES, st.text(max_size=6)), max_size=14).map("".join))
def test_a_text_without_a_secrets_name_skips_its_patterns_and_reads_the_same(text: str) -> None:
    """The two patterns that need a secret's name run only where one is (they cost 190 us on a
    sale's log line, the look for a name 13 us): what comes out is what running them all made."""
    assert redact(text) == _every_pattern(text)


def test_the_look_for_a_name_begins_only_where_a_name_can() -> None:
    # each word begins with a plain letter, which the look-ahead lists (under the same flag)
    words = redact_module._SECRET_WORDS.split("|")
    assert all(word[0].isalpha() for word in words)
    assert set(redact_module._NAME_STARTS) == {word[0] for word in words}


@settings(max_examples=300)
@given(st.lists(st.one_of(PIECES, st.text(max_size=6)), max_size=14).map("".join))
def test_the_look_ahead_finds_a_name_exactly_where_the_words_alone_do(text: str) -> None:
    words_alone = re.compile(rf"(?i){redact_module._SECRET_WORDS}")
    found = redact_module._A_SECRET_WORD.search(text)
    alone = words_alone.search(text)
    assert (found and found.span()) == (alone and alone.span())


def test_a_sales_log_line_is_masked_for_what_it_holds_only() -> None:
    line = "sale 1881884ee6254b89ad4c12152a81100d completed: paid $2.50 (captured)"
    assert redact(line) == line
    assert redact(line + " token=abc") == line + f" token={MASK}"


def test_the_two_largest_patterns_are_compiled_only_for_a_text_that_names_a_secret() -> None:
    """_QUOTED and _PLAIN were compiled at import: 1.4 ms of every start (and of every command
    that imports redaction), whose log lines name no secret. A start's lines at INFO (as a
    unit logs them: recovery, each reader's availability, the kiosk API) compile neither; the
    first text that names a secret does, and is masked."""

    probe = (
        "from kiosk_agent import redact\n"
        "for line in ['recovery finished: no open sales in the journal',\n"
        "             'terminal SIM-0001 waits for the start: journal: reading its file whole'\n"
        "             ' before money moves on it',\n"
        "             'terminal SIM-0001 in service after starting for 0.1 s',\n"
        "             'kiosk_api:screen: kiosk API on 127.0.0.1:8125',\n"
        "             'admin API on http://127.0.0.1:8124']:\n"
        "    assert redact.redact(line) == line\n"
        "print(redact._secret_values.cache_info().currsize)\n"
        "print(redact.redact('api_key=abc123 and \"token\": \"xyz\"'))\n"
        "print(redact._secret_values.cache_info().currsize)\n"
    )
    done = in_a_fresh_python(probe)
    before, masked, after = done.stdout.splitlines()
    assert (before, after) == ("0", "1")
    assert masked == f'api_key={MASK} and "token": "{MASK}"'
