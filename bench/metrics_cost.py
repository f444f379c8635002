"""What prometheus_client costs the agent: import time, resident memory, and a scrape.

    python bench/metrics_cost.py [--runs 5]

Each run is a fresh interpreter that imports what a running agent has loaded (the app, the admin
API, the simulator is not among them), measures its resident memory (VmRSS) as the baseline,
then imports ``kiosk_agent.admin.metrics`` (prometheus_client with it) and builds the registry
the admin API builds (process, platform and GC collectors, the agent's collector, the two
histograms), feeds it 2 terminals x 6 outcomes of sales and 5 kinds x 3 outcomes of calls (every
histogram series a unit can have on those terminals), and scrapes it 200 times in each format.
Figures are medians over the runs; memory as added KiB and as a ratio to the baseline.

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

PROBE = r"""
import gc, json, sys, time
from types import SimpleNamespace

def rss_kib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])

import kiosk_agent.app, kiosk_agent.admin.server, kiosk_agent.cli  # what the agent has loaded
gc.collect()
base, modules = rss_kib(), len(sys.modules)
began = time.perf_counter()
from kiosk_agent.admin.metrics import AgentMetrics
imported_ms = (time.perf_counter() - began) * 1000
gc.collect()
after_import = rss_kib()

from kiosk_agent.health.model import Health
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.settings import CallKind

health = Health("bench")
terminals = ["SIM-0001", "SIM-0002"]
for device in terminals:
    health.report_terminal(device, online=True, connected=True, latency_ms=20.0, pinged=True)
    health.report_availability(device, available=True, reason="", since=0.0, changes=0)
metrics = AgentMetrics(SimpleNamespace(health=health), lambda name: None)
number = 0
for device in terminals:
    for state in (s for s in SaleState if s.final):
        for _ in range(10):
            number += 1
            sale = str(number)
            metrics.timings.sale(SaleEvent(sale, sale, "b", SaleState.STARTED, 250,
                                           terminal=device), now=0.0)
            event = SaleEvent(sale, sale, "b", state, 250, 250, terminal=device)
            metrics.timings.sale(event, now=2.5)
            health.record_sale(event)
for kind in CallKind:
    for outcome in ("ok", "error", "unreachable"):
        for _ in range(10):
            metrics.timings.call(kind, 0.04, outcome)
gc.collect()
after_fill = rss_kib()

scrape_ms = {}
sizes = {}
for name, accept in (("text", None), ("openmetrics", "application/openmetrics-text")):
    began = time.perf_counter()
    for _ in range(200):
        body, _type = metrics.exposition(accept)
    scrape_ms[name] = (time.perf_counter() - began) * 1000 / 200
    sizes[name] = len(body)
print(json.dumps({
    "base_kib": base, "import_kib": after_import - base, "filled_kib": after_fill - base,
    "import_ms": imported_ms, "modules": len(sys.modules) - modules,
    "scrape_text_ms": scrape_ms["text"], "scrape_openmetrics_ms": scrape_ms["openmetrics"],
    "body_text_bytes": sizes["text"], "body_openmetrics_bytes": sizes["openmetrics"],
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    runs = []
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", PROBE], check=True, capture_output=True,
                             text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))

    def median(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    base = median("base_kib")
    figures = {
        "agent_rss_kib": base,
        "import_rss_kib": median("import_kib"),
        "filled_rss_kib": median("filled_kib"),
        "filled_rss_ratio": round((base + median("filled_kib")) / base, 4),
        "import_ms": round(median("import_ms"), 2),
        "modules_added": median("modules"),
        "scrape_text_ms": round(median("scrape_text_ms"), 3),
        "scrape_openmetrics_ms": round(median("scrape_openmetrics_ms"), 3),
        "body_text_bytes": median("body_text_bytes"),
        "body_openmetrics_bytes": median("body_openmetrics_bytes"),
    }
    print(f"agent with the admin API loaded, before /metrics: {base:.0f} KiB resident")
    print(f"import of kiosk_agent.admin.metrics (prometheus_client): "
          f"+{figures['import_rss_kib']:.0f} KiB, +{figures['modules_added']:.0f} modules, "
          f"{figures['import_ms']} ms")
    print(f"registry built and every histogram series filled: +{figures['filled_rss_kib']:.0f} KiB"
          f" (x{figures['filled_rss_ratio']} the agent's memory)")
    print(f"one scrape: text {figures['scrape_text_ms']} ms ({figures['body_text_bytes']:.0f} B),"
          f" OpenMetrics {figures['scrape_openmetrics_ms']} ms "
          f"({figures['body_openmetrics_bytes']:.0f} B)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
