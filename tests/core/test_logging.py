"""Structured logs, with card numbers and secrets masked by the filter on every handler."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiosk_agent.core.logging import setup_logging

CARD = "4111 1111 1111 1111"


@pytest.fixture
def root_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


def test_json_lines_carry_extras_and_no_card_or_key(root_restored: None) -> None:
    out = io.StringIO()
    setup_logging({"format": "json", "level": "INFO"}, stream=out)
    log = logging.getLogger("kiosk_agent.test")
    log.info("charged card %s with api_key=%s", CARD, "sk_live_abcdef123456", extra={"sale": "s1"})
    try:
        raise RuntimeError(f"refused Authorization: Bearer sk_live_abcdef123456 for {CARD}")
    except RuntimeError:
        log.exception("call failed")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["level"] == "INFO"
    assert first["logger"] == "kiosk_agent.test"
    assert first["sale"] == "s1"
    assert "411111******1111" in first["msg"]
    text = out.getvalue()
    assert "sk_live_abcdef123456" not in text
    assert "4111 1111 1111 1111" not in text
    assert second["exc"].startswith("Traceback")


def test_text_to_a_file_and_debug_hidden_at_info(root_restored: None, tmp_path: Path) -> None:
    path = tmp_path / "logs" / "agent.log"
    handler = setup_logging({"format": "text", "level": "INFO", "file": str(path)})
    log = logging.getLogger("kiosk_agent.test")
    log.debug("not shown")
    log.warning("refresh_token: rt_secret_value rejected")
    handler.flush()
    text = path.read_text()
    assert "not shown" not in text
    assert "WARNING kiosk_agent.test: refresh_token: [REDACTED] rejected" in text


def test_setting_up_again_replaces_the_handler(root_restored: None) -> None:
    setup_logging({}, stream=io.StringIO())
    setup_logging({}, stream=io.StringIO())
    named = [h for h in logging.getLogger().handlers if h.get_name() == "kiosk-agent"]
    assert len(named) == 1
