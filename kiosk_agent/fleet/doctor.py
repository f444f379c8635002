"""The doctor's checks of the ``upstream:`` section: can the heartbeats leave the unit?

Registered with the doctor (``doctor.register_check``) when this module is imported; the doctor
imports it by name (``doctor.CHECK_OWNERS``) and imports nothing of fleet itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlsplit

from kiosk_agent.doctor import Report, Verdict, describe, register_check
from kiosk_agent.fleet.topics import DEFAULT_TOPIC_PREFIX

# A report of a unit with 16 terminals is under 10 KiB: the echo test sends this much
ECHO_BYTES = 16 * 1024


async def check_upstream(report: Report, upstream: dict[str, Any], within: float) -> None:
    """Connects only; sends no report."""
    if "http" in upstream:
        await check_http(report, upstream["http"]["url"], within)
    if "mqtt" in upstream:
        from kiosk_agent.fleet.component import host_device_id

        device_id = upstream.get("device_id") or host_device_id()
        await check_mqtt(report, upstream["mqtt"], within, device_id)


async def check_http(report: Report, url: str, within: float) -> None:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        async with asyncio.timeout(within):
            _, writer = await asyncio.open_connection(parts.hostname, port)
        writer.close()
        await writer.wait_closed()
    except (OSError, TimeoutError) as err:
        report.add(
            "upstream http",
            Verdict.FAIL,
            f"{parts.hostname}:{port}: {describe(err)}",
            "check the URL, DNS and that the firewall lets the unit out",
        )
    else:
        report.add("upstream http", Verdict.PASS, f"{parts.hostname}:{port} accepts connections")


async def check_mqtt(
    report: Report, conf: dict[str, Any], within: float, device_id: str = "doctor"
) -> None:
    import aiomqtt

    from kiosk_agent.fleet.mqtt import CaFileError, mqtt_client, passing_client_id

    where = f"{conf['host']}:{conf['port']}"
    try:
        # Its own client id: reusing the agent's would disconnect the running agent.
        client = mqtt_client(conf, passing_client_id("doctor"), timeout=within)
        async with asyncio.timeout(within), client:
            pass
    except CaFileError as err:
        report.add("upstream mqtt", Verdict.FAIL, str(err),
                   "point ca_file at the CA's certificate in PEM (openssl x509 -in FILE -text)")
        return
    except (aiomqtt.MqttError, OSError, TimeoutError) as err:
        fix = "check host, port, user and password; with tls: check the CA and the clock"
        report.add("upstream mqtt", Verdict.FAIL, f"{where}: {describe(err)}", fix)
        return
    topic = f"{conf.get('topic_prefix', DEFAULT_TOPIC_PREFIX)}/{device_id}/doctor"
    try:
        echoed = await _send_as_a_unit(conf, topic, min(within, 3.0))
    except (aiomqtt.MqttError, OSError, TimeoutError) as err:
        report.add(
            "upstream mqtt", Verdict.FAIL,
            f"{where} accepted a plain connection but not QoS 1 and retained messages, which a "
            f"unit sends (its last will, its reports): {describe(err)}",
            "let the broker take QoS 1 and retained messages (Mosquitto: max_qos, "
            "retain_available)",
        )
        return
    if not echoed:  # MQTT 3.1.1 drops a refused publish without a word: only an echo tells
        report.add(
            "upstream mqtt", Verdict.WARN,
            f"{where} accepted the connection, QoS 1 and retained messages, but did not hand "
            f"back a {ECHO_BYTES // 1024} KiB message on {topic}",
            "a message size limit below a report's (Mosquitto: message_size_limit) or an ACL "
            "that refuses this user's writes there drops reports in silence; fine if this "
            "user may only write there, not read",
        )
        return
    report.add("upstream mqtt", Verdict.PASS, f"{where} accepted the connection, QoS 1, "
               f"retained messages and a report-sized message ({topic})")


async def _send_as_a_unit(conf: dict[str, Any], topic: str, within: float) -> bool:
    """Connect with a QoS 1 retained last will and publish a QoS 1 retained message, as a unit
    does (a broker that takes neither closes the connection), both empty: an empty retained
    message leaves nothing on the broker. Then whether a report-sized message sent to
    ``topic`` comes back (not retained)."""
    import aiomqtt

    from kiosk_agent.fleet.mqtt import mqtt_client, passing_client_id

    will = aiomqtt.Will(topic, b"", qos=1, retain=True)
    client = mqtt_client(conf, passing_client_id("doctor"), timeout=within, will=will)
    async with asyncio.timeout(within), client:
        await client.publish(topic, b"", qos=1, retain=True)
    # a connection of its own: a broker may close one that sends a message too large
    with contextlib.suppress(TimeoutError, aiomqtt.MqttError):
        async with asyncio.timeout(within), client:
            await client.subscribe(topic, qos=1)
            await client.publish(topic, b"x" * ECHO_BYTES, qos=0)  # no PUBACK to wait for
            async for message in client.messages:
                if message.payload:
                    return True
    return False


register_check("upstream", check_upstream)
