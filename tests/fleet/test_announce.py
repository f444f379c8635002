"""What a unit publishes of its configs on connect, given what the broker keeps."""

import json

from hypothesis import given
from hypothesis import strategies as st

from kiosk_agent.fleet.announce import config_payloads, plan_announce
from kiosk_agent.fleet.discovery import discovery_messages
from kiosk_agent.fleet.entities import RETIRED, DiscoveryOptions
from kiosk_agent.fleet.topics import discovery_topic

DEVICE = "unit-7"
BASE = f"kiosk-agent/{DEVICE}"
WANTED = config_payloads(discovery_messages(
    DEVICE, "1.4.0", f"{BASE}/state", f"{BASE}/availability", "homeassistant",
    DiscoveryOptions(terminals=(("SIM-0001", "front"),)), f"{BASE}/event"))
OWN_OLD = discovery_topic("homeassistant", "sensor", DEVICE, "uptime")
FOREIGN = discovery_topic("homeassistant", "sensor", DEVICE, "cpu_load")


def own(key: str) -> bytes:
    return json.dumps({"unique_id": f"kiosk_agent_{DEVICE}_{key}"}).encode()


# what a broker may hold: each config kept as announced, kept otherwise, or not at all; an
# earlier version's own config, and another program's under the same node id
kept_configs = st.tuples(
    st.lists(st.sampled_from(("same", "other", "gone")), min_size=len(WANTED),
             max_size=len(WANTED)),
    st.booleans(),
    st.booleans(),
)


@given(kept_configs)
def test_after_the_plan_the_broker_holds_exactly_what_the_unit_announces(
    case: tuple[list[str], bool, bool],
) -> None:
    """Whatever the broker kept, after the plan it holds every config as the unit would
    publish it, none of the unit's own it no longer announces, and another program's as it
    was; and nothing is published that the broker already held as it is."""
    fates, old_kept, foreign_kept = case
    broker: dict[str, bytes] = {}
    for (topic, payload), fate in zip(WANTED, fates, strict=True):
        if fate != "gone":
            broker[topic] = payload if fate == "same" else b'{"unique_id": "x"}'
    if old_kept:
        broker[OWN_OLD] = own("uptime")
    if foreign_kept:
        broker[FOREIGN] = b'{"unique_id": "host-cpu"}'
    plan = plan_announce(DEVICE, "homeassistant", WANTED, dict(broker), first=True)
    assert plan.checked
    for topic, payload in plan.publish:
        broker[topic] = payload
    for topic in plan.clear:
        broker.pop(topic, None)
    assert {t: broker.get(t) for t, _ in WANTED} == dict(WANTED)
    assert OWN_OLD not in broker
    assert (FOREIGN in broker) == foreign_kept
    assert len(plan.publish) == fates.count("other") + fates.count("gone")


def test_not_known_what_the_broker_keeps_every_config_is_published() -> None:
    first = plan_announce(DEVICE, "homeassistant", WANTED, None, first=True)
    assert (first.publish, first.checked) == (WANTED, False)
    assert first.clear == [discovery_topic("homeassistant", c, DEVICE, k) for c, k in RETIRED]
    assert plan_announce(DEVICE, "homeassistant", WANTED, None, first=False).clear == []


def test_a_broker_that_keeps_every_config_as_it_is_gets_nothing() -> None:
    plan = plan_announce(DEVICE, "homeassistant", WANTED, dict(WANTED), first=True)
    assert (plan.publish, plan.clear) == ([], [])
