"""Home Assistant's buttons and update entity: what a unit can be asked to do over MQTT.

Off unless ``upstream.commands: true``. Commands come only on the unit's own command topics
(``<topic_prefix>/<device_id>/command/<key>``); a retained one is old news (it would act at every
connect) and is ignored. Each is logged with who asked as far as MQTT can say: MQTT 3.1.1 names
no sender, so a JSON payload's ``"by"`` is logged, else the broker's log holds the client id.
None moves money: restart waits for no sale in progress (refused while one is), a test print
is refused while its reader holds a sale, a ping is a status call.

- ``restart``: the agent's own graceful stop (as ``SIGQUIT``: new sales refused, exit 131),
  which systemd's ``Restart=on-failure`` starts again ``RestartSec`` (5 s) later.
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
from typing import Any

from kiosk_agent.fleet.entities import Entity, terminal_key

RESTART = "restart"
PING = "ping_"
TEST_PRINT = "test_print_"
PRESS = "PRESS"


def command_topic(base: str, key: str) -> str:
    return f"{base}/command/{key}"


def latest_version_topic(base: str) -> str:
    """Where the operator publishes the newest version, retained, for the whole prefix."""
    return f"{base.rsplit('/', 1)[0]}/latest_version"


def command_entities(base: str, terminals: Sequence[tuple[str, str]]) -> list[Entity]:
    """The restart button, a ping and a test-print button per terminal, the update entity."""
    entities = [
        _button(base, RESTART, "Restart", {"device_class": "restart"}),
        Entity(
            "update",
            "update",
            "Firmware",
            {
                "value_template": "{{ value_json.version }}",
                "latest_version_topic": latest_version_topic(base),
                "device_class": "firmware",
                "title": "kiosk-agent",
            },
            expires=False,  # its platform takes no expire_after
        ),
    ]
    keys: set[str] = set()
    for device_id, name in terminals:
        key = terminal_key(device_id, keys)
        keys.add(key)
        entities += [
            _button(base, f"{PING}{key}", f"Ping {name or device_id}",
                    {"icon": "mdi:access-point-check"}),
            _button(base, f"{TEST_PRINT}{key}", f"Test print {name or device_id}",
                    {"icon": "mdi:printer-check"}),
        ]
    return entities


def _button(base: str, key: str, name: str, own: dict[str, Any]) -> Entity:
    config = {"command_topic": command_topic(base, key), "payload_press": PRESS,
              "entity_category": "config", **own}
    return Entity("button", key, name, config, expires=False, stateless=True)


def terminal_of(key: str, terminals: Sequence[tuple[str, str]]) -> str | None:
    """The terminal (device id) a ``ping_``/``test_print_`` key names."""
    keys: set[str] = set()
    for device_id, _ in terminals:
        own = terminal_key(device_id, keys)
        keys.add(own)
        if key in (f"{PING}{own}", f"{TEST_PRINT}{own}"):
            return device_id
    return None


def is_press(payload: bytes) -> bool:
    """Home Assistant's press (``PRESS``), or a JSON object (which may say ``"by"``). An empty
    payload is a retained command being cleared (handed to a live subscription unflagged)."""
    if payload == PRESS.encode():
        return True
    try:
        return isinstance(json.loads(payload), dict)
    except (ValueError, RecursionError):
        return False


def asked_by(payload: bytes) -> str:
    """Who asked, as far as the payload says (MQTT 3.1.1 names no sender)."""
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("by"), str):
        return repr(body["by"][:64])
    return "an MQTT client (MQTT names no sender: the broker's log has its client id)"


def request_graceful_restart() -> str | None:
    """Ask `kiosk-agent run` for its graceful stop with a non-zero exit (131) that systemd
    restarts; the reason when nothing would handle it (not run by `kiosk-agent run`)."""
    if signal.getsignal(signal.SIGQUIT) in (signal.SIG_DFL, signal.SIG_IGN, None):
        return "the agent is not run by `kiosk-agent run` (nothing would restart it)"
    os.kill(os.getpid(), signal.SIGQUIT)
    return None
