"""Home Assistant's buttons and update entity: what a unit can be asked to do over MQTT.

Off unless ``upstream.commands: true``. Commands come only on the unit's own command topics
(``<topic_prefix>/<device_id>/command/<key>``); a retained one is old news (it would act at every
connect) and is ignored. Each is logged with its topic and who asked as far as MQTT can say:
MQTT 3.1.1 names no sender, so a JSON payload's ``"by"`` is logged (else "not given"); who may
publish there at all is the broker's ACL's to say. None moves money or cuts a sale short: a
restart drains first, a test print is refused while its reader holds a sale, a ping is a
status call.

- ``restart``: the agent's own graceful stop (as ``SIGQUIT``: new sales refused, the sales in
  progress finish, exit 131), which systemd's ``Restart=on-failure`` starts again
  ``RestartSec`` (5 s) later.
- ``ping_<terminal>``, ``test_print_<terminal>``: the admin API's buttons
  (sales/terminal_actions.py).
- The update entity: the installed version (the report's) and the newest, as the operator
  publishes it, retained, on ``<topic_prefix>/latest_version``.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Sequence

from kiosk_agent.fleet.entities import (
    PING_BUTTON,
    PRESS,
    RESTART_BUTTON,
    TERMINAL_COMMANDS,
    TEST_PRINT_BUTTON,
    terminal_of,
)

# the commands' keys, from their entities' descriptions (fleet/entities.py)
RESTART = RESTART_BUTTON.key
PING = PING_BUTTON.key_prefix
TEST_PRINT = TEST_PRINT_BUTTON.key_prefix

def terminal_commanded(key: str, terminals: Sequence[tuple[str, str]]) -> str | None:
    """The terminal (device id) a ``ping_``/``test_print_`` key names."""
    return terminal_of(key, terminals, TERMINAL_COMMANDS)


BY_MAX = 64  # characters of a press's "by" (a name, not a message)
NOT_GIVEN = "not given"


class NotAPress(ValueError):
    """A payload on a command topic that is no press; its words say what is wrong."""


def asked_by(payload: bytes) -> str:
    """Who says they asked, for the log: a JSON press's ``"by"`` (``{"by": "ha-lobby"}``), else
    ``"not given"`` (Home Assistant's ``PRESS``). MQTT 3.1.1 does not tell a subscriber who
    published: ``by`` is the publisher's own word, logged and trusted for nothing else; the
    broker's ACL is what says who may publish on the unit's command topics.

    Raises :class:`NotAPress` for a payload that is neither ``PRESS`` nor a JSON object, and for
    a ``by`` that is not printable ASCII of 1 to ``BY_MAX`` characters (it goes into the log
    as it is: no terminal escape, no line of its own). An empty payload is a retained command
    being cleared (handed to a live subscription unflagged): no press either."""
    if payload == PRESS.encode():
        return NOT_GIVEN
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict):
        raise NotAPress(f"its payload is not {PRESS} (nor a JSON object)")
    if "by" not in body:
        return NOT_GIVEN
    by = body["by"]
    if not isinstance(by, str) or not 1 <= len(by) <= BY_MAX or not all(
        " " <= c <= "~" for c in by
    ):
        raise NotAPress(f'its "by" is not printable ASCII of 1 to {BY_MAX} characters')
    return repr(by)


def request_graceful_restart() -> str | None:
    """Ask `kiosk-agent run` for its graceful stop with a non-zero exit (131) that systemd
    restarts; the reason when nothing would handle it (not run by `kiosk-agent run`)."""
    if signal.getsignal(signal.SIGQUIT) in (signal.SIG_DFL, signal.SIG_IGN, None):
        return "the agent is not run by `kiosk-agent run` (nothing would restart it)"
    os.kill(os.getpid(), signal.SIGQUIT)
    return None
