"""Four units of the project in a real Home Assistant, over a real Mosquitto.

    python bench/home_assistant.py --hass ~/ha2024/bin/hass [--release 2024.3]

Home Assistant is not a dependency of the project: give the ``hass`` of a virtualenv it is
installed in (HA 2024.3.3: ``python3.11 -m venv /tmp/ha2024 && /tmp/ha2024/bin/pip install
homeassistant==2024.3.3 paho-mqtt==1.6.1 'josepy<2'``); without one the script says so and
exits 0 (skipped). HA 2026.2 needs Python 3.13: a Debian trixie chroot (``debootstrap
--variant=minbase --include=python3-venv,python3-dev,build-essential,libffi-dev,libssl-dev,
zlib1g-dev,libjpeg-dev,libturbojpeg0,libpcap-dev,ca-certificates trixie ROOT``, then
``/srv/ha/bin/pip install homeassistant==2026.2.3`` in a venv there), with ``/proc``, ``/dev``
and this machine's ``/tmp`` bound into it (the script's files live in /tmp), and ``--hass`` a
wrapper that runs ``chroot ROOT /srv/ha/bin/hass "$@"``; ``--release 2026.2``.

It starts Mosquitto, the payment simulator, Home Assistant (the MQTT integration set up as a
config entry, the recorder on SQLite) and four ``kiosk-agent run`` processes, each with an
``upstream:`` MQTT section with every optional field set (name, area, serial number, model,
model id, hardware version, support and configuration URLs, ``home_assistant``, commands).
Then:

1. every entity of the four units comes live in Home Assistant (its state machine, read from
   the recorder's database);
2. a clean stop (SIGTERM) of one unit: what HA records for its Status and Problem;
3. a crash (SIGKILL) of another and its start again: what HA records meanwhile (the last will's
   ``unavailable``, then nothing of the last run shown as now before the first report);
4. the warnings and errors ``homeassistant.components.mqtt`` logged in the whole run.

The last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _support import free_port  # shared with the tests, without the test tree

UNITS = 4
INTERVAL_S = 10  # a report every 10 s: the sequences show within a minute


def wait_port(port: int, limit: float = 20) -> None:
    deadline = time.monotonic() + limit
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def start_broker(directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    conf = directory / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                    "max_queued_messages 200000\nmax_inflight_messages 100\n"
                    f"log_dest file {directory}/mosquitto.log\n")
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_port(port)
    return proc, port


def start_simulator(directory: Path) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiosk_agent", "sim", "--port", "0", "--time-scale", "10"],
        stdout=subprocess.PIPE, stderr=(directory / "sim.err").open("w"), text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        raise SystemExit(f"the simulator did not start: {line!r}")
    return proc, json.loads(line[len("READY "):])


def home_assistant_config(directory: Path, port: int) -> Path:
    config = directory / "ha"
    (config / ".storage").mkdir(parents=True)
    (config / "configuration.yaml").write_text(
        "homeassistant:\n  name: Bench\n  latitude: 0\n  longitude: 0\n  elevation: 0\n"
        "  unit_system: metric\n  time_zone: UTC\n  currency: USD\n"
        "logger:\n  default: info\n"
        "recorder:\n  commit_interval: 1\n"
    )
    entry = {
        "entry_id": uuid.uuid4().hex, "version": 1, "minor_version": 1, "domain": "mqtt",
        "title": "127.0.0.1", "data": {"broker": "127.0.0.1", "port": port, "discovery": True},
        "options": {}, "pref_disable_new_entities": False, "pref_disable_polling": False,
        "source": "user", "unique_id": None, "disabled_by": None,
    }
    (config / ".storage" / "core.config_entries").write_text(json.dumps({
        "version": 1, "minor_version": 1, "key": "core.config_entries",
        "data": {"entries": [entry]},
    }))
    return config


def unit_config(directory: Path, index: int, info: dict[str, Any], port: int,
                release: str) -> Path:
    path = directory / f"unit{index}.yaml"
    path.write_text(
        "service:\n"
        f"  base_url: {info['base_url']}\n  reporting_url: {info['reporting_url']}\n"
        f"  ws_url: {info['ws_url']}\n  mid: \"{info['mid']}\"\n"
        "  api_key: !env_var KIOSK_API_KEY\n"
        f"  client_id: {info['client_id']}\n  client_secret: !env_var KIOSK_CLIENT_SECRET\n"
        f"terminals: [{{device_id: SIM-000{index}, name: front}}]\n"
        f"journal: {{path: {directory}/journal{index}.db}}\n"
        "upstream:\n"
        f"  device_id: store-000{index}\n"
        f"  name: Store {index}\n"
        f"  interval: {INTERVAL_S}\n"
        "  suggested_area: Lobby\n"
        f"  serial_number: PI-000{index}\n"
        "  model: Coffee kiosk\n"
        "  model_id: CK-2\n"
        "  hw_version: Raspberry Pi 4 Model B Rev 1.4\n"
        f"  configuration_url: http://kiosk-{index}.example:8124/\n"
        "  support_url: https://support.example/kiosk\n"
        f"  home_assistant: \"{release}\"\n"
        "  commands: true\n"
        f"  mqtt: {{host: 127.0.0.1, port: {port}}}\n"
    )
    return path


class Unit:
    def __init__(self, config: Path, info: dict[str, Any], index: int) -> None:
        self.config = config
        self.index = index
        self.log = config.with_suffix(".log")
        self.env = {**os.environ, "KIOSK_API_KEY": info["api_key"],
                    "KIOSK_CLIENT_SECRET": info["client_secret"]}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kiosk_agent", "run", "-c", str(self.config)],
                stdout=subprocess.DEVNULL, stderr=log, env=self.env,
            )

    def signal(self, signum: int) -> int:
        assert self.proc is not None
        self.proc.send_signal(signum)
        return self.proc.wait(60)


def states(database: Path, entity_id: str) -> list[tuple[float, str]]:
    """(time, state) of each change Home Assistant's recorder holds for one entity."""
    if not database.exists():
        return []
    db = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5)
    try:
        rows = db.execute(
            "SELECT s.last_updated_ts, s.state FROM states s JOIN states_meta m "
            "ON s.metadata_id = m.metadata_id WHERE m.entity_id = ? ORDER BY s.state_id",
            (entity_id,),
        ).fetchall()
    except sqlite3.OperationalError:  # its tables not made yet
        return []
    finally:
        db.close()
    return [(float(at), str(state)) for at, state in rows]


def entities_live(database: Path) -> dict[str, str]:
    """entity_id -> newest state of every kiosk entity the recorder holds."""
    if not database.exists():
        return {}
    db = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5)
    try:
        rows = db.execute(
            "SELECT m.entity_id, s.state FROM states s JOIN states_meta m "
            "ON s.metadata_id = m.metadata_id WHERE m.entity_id LIKE '%.store_%' "
            "ORDER BY s.state_id"
        ).fetchall()
    except sqlite3.OperationalError:
        return {}
    finally:
        db.close()
    return {entity: state for entity, state in rows}


def wait(predicate: Any, limit: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > limit:
            raise SystemExit(f"not within {limit} s: {what}")
        time.sleep(0.5)
    return time.monotonic() - started


def sequence(database: Path, entity_id: str, since: float) -> list[str]:
    return [f"+{at - since:.1f}s {state}" for at, state in states(database, entity_id)
            if at >= since - 0.5]


def mqtt_log_lines(log: Path) -> list[str]:
    pattern = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b.*homeassistant\.components\.mqtt")
    return [line for line in log.read_text(errors="replace").splitlines()
            if pattern.search(line)]


def run(hass: str, release: str) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix="ha-bench-"))
    procs: list[subprocess.Popen[Any]] = []
    units: list[Unit] = []
    figures: dict[str, Any] = {"release": release, "units": UNITS}
    try:
        broker, port = start_broker(directory)
        procs.append(broker)
        sim, info = start_simulator(directory)
        procs.append(sim)
        config = home_assistant_config(directory, port)
        log = config / "ha.log"
        database = config / "home-assistant_v2.db"
        started = time.monotonic()
        ha = subprocess.Popen([hass, "-c", str(config), "--log-file", str(log)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(ha)
        wait(lambda: log.exists() and "Home Assistant initialized" in log.read_text(
            errors="replace"), 600, "Home Assistant starts")
        figures["ha_start_s"] = round(time.monotonic() - started, 1)
        print(f"Home Assistant up in {figures['ha_start_s']} s")
        for index in range(1, UNITS + 1):
            unit = Unit(unit_config(directory, index, info, port, release), info, index)
            unit.start()
            units.append(unit)
        started = time.monotonic()
        wanted = [f"sensor.store_{i}_status" for i in range(1, UNITS + 1)]
        wait(lambda: all(entities_live(database).get(e) == "ok" for e in wanted), 300,
             "every unit's Status ok in Home Assistant")
        figures["all_units_ok_in_ha_s"] = round(time.monotonic() - started, 1)
        time.sleep(2 * INTERVAL_S)
        live = entities_live(database)
        figures["entities"] = len(live)
        figures["entities_unavailable"] = sorted(e for e, s in live.items()
                                                 if s == "unavailable")
        print(f"{UNITS} units live in {figures['all_units_ok_in_ha_s']} s: {len(live)} entities"
              f" recorded, unavailable: {figures['entities_unavailable'] or 'none'}")

        # a clean stop
        stopped_at = time.time()
        figures["clean_stop_exit"] = units[0].signal(signal.SIGTERM)
        time.sleep(5)
        for entity in ("sensor.store_1_status", "binary_sensor.store_1_problem"):
            figures[f"clean_stop {entity}"] = sequence(database, entity, stopped_at)
            print(f"clean stop, {entity}: {figures[f'clean_stop {entity}']}")

        # a crash, and the start again
        crashed_at = time.time()
        units[1].signal(signal.SIGKILL)
        time.sleep(3)
        units[1].start()
        wait(lambda: states(database, "sensor.store_2_status")[-1][1] == "ok", 120,
             "the crashed unit back")
        time.sleep(3)
        for entity in ("sensor.store_2_status", "binary_sensor.store_2_problem",
                       "sensor.store_2_open_sales"):
            figures[f"crash_restart {entity}"] = sequence(database, entity, crashed_at)
            print(f"crash and start again, {entity}: {figures[f'crash_restart {entity}']}")
    finally:
        for unit in units:
            if unit.proc is not None and unit.proc.poll() is None:
                unit.signal(signal.SIGTERM)
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    lines = mqtt_log_lines(log)
    figures["mqtt_warnings"] = sum(" WARNING " in line for line in lines)
    figures["mqtt_errors"] = len(lines) - figures["mqtt_warnings"]
    for line in lines[:20]:
        print(f"HA log: {line[:300]}")
    print(f"homeassistant.components.mqtt: {figures['mqtt_warnings']} warning(s), "
          f"{figures['mqtt_errors']} error(s); files kept in {directory}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hass", default=os.environ.get("HASS", "hass"),
                        help="Home Assistant's hass (default: $HASS, else on the PATH)")
    parser.add_argument("--release", default="2024.3", help="upstream.home_assistant")
    args = parser.parse_args()
    hass = shutil.which(args.hass)
    if hass is None:
        print(f"skipped: no Home Assistant at {args.hass} (see this script's docstring)")
        print(json.dumps({"skipped": True}))
        return
    print(json.dumps(run(hass, args.release)))


if __name__ == "__main__":
    main()
