"""What a unit publishes of its discovery configs when it connects: only what the broker lacks.

A broker with persistence keeps every retained config across its restart. Announcing all of
them again at each connect made a broker restart of 10,000 units 170,000 retained publishes
within the first back-off ceiling: the one-threaded broker fell behind, acknowledgements
outlived their deadline, units dropped and announced again (336 s until all were back). So on
connect a unit first reads its own configs back (it subscribes to them, then sends itself a
message on ``end_topic``, which the broker hands back behind every retained one) and publishes
only a config that is missing or differs (a new version, a changed option, one a person or
``fleet forget`` cleared), and clears its own configs it no longer announces. Not read back in
time (an ACL that refuses the marker, a broker too slow to answer): everything is published,
as before. Home Assistant's birth message is always answered with every config.

The same plan serves the agent's sink (``fleet.mqtt``) and the bench's simulated units
(``bench/fleet_units.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kiosk_agent.fleet.discovery import own_config
from kiosk_agent.fleet.entities import RETIRED
from kiosk_agent.fleet.topics import discovery_topic

# How long a unit waits on connect for its configs read back (seconds, the sink's clock): the
# acknowledgement deadline of a publish; past it the broker is too busy or refuses the marker
KEPT_WAIT = 10.0
END = b"end"  # the marker's payload


def end_topic(base_topic: str) -> str:
    """Where a unit sends itself the marker that ends its configs read back (not retained;
    under its own topics, which the documented ACL lets it read and write)."""
    return f"{base_topic}/end"


def config_payloads(messages: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, bytes]]:
    """Each config as the bytes a unit publishes and the broker hands back."""
    return [(topic, json.dumps(config).encode()) for topic, config in messages]


@dataclass(frozen=True, slots=True)
class Announce:
    """The configs to publish (topic, payload) and the topics to clear (an empty retained
    message); ``checked``: decided from what the broker keeps (else everything is published)."""

    publish: list[tuple[str, bytes]]
    clear: list[str]
    checked: bool


def plan_announce(
    device_id: str,
    prefix: str | None,
    wanted: list[tuple[str, bytes]],
    kept: Mapping[str, bytes] | None,
    *,
    first: bool,
) -> Announce:
    """What to publish given ``kept``, the retained configs the broker handed back under this
    unit's device id (None: not known). Unknown, every config is published, and on a run's
    first connect the configs of earlier versions (``RETIRED``) are cleared; known, only a
    config the broker lacks or holds otherwise, and the clears of this unit's own configs
    (by unique id: another program may share the node id) that it no longer announces."""
    if kept is None:
        retired = ([discovery_topic(prefix, component, device_id, key)
                    for component, key in RETIRED] if first and prefix else [])
        return Announce(list(wanted), retired, checked=False)
    announced = {topic for topic, _ in wanted}
    return Announce(
        [(topic, payload) for topic, payload in wanted if kept.get(topic) != payload],
        sorted(topic for topic, payload in kept.items()
               if topic not in announced and payload and own_config(device_id, payload)),
        checked=True,
    )
