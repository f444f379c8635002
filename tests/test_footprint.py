"""What a running agent imports: only what a sale needs (a Pi Zero pays for every module in
start-up time and memory). Boarding, reporting, the simulator and the admin page come on use."""

from __future__ import annotations

import json
import subprocess
import sys

# What `kiosk-agent run` imports for an agent with a kiosk API trigger and no admin section.
# (Reporting's transactions and paging are not in the list: every start asks reporting for
# charges the journal cannot account for before it takes a customer, docs/journal.md. The report
# kinds a person pulls, deposits, chargebacks and adjustments, are.)
RUN = ["kiosk_agent.cli.agent", "kiosk_agent.app", "kiosk_agent.platforms.kiosk_api"]
NOT_FOR_A_SALE = [
    "kiosk_agent.service.models.boarding",
    "kiosk_agent.service.boarding",
    "kiosk_agent.service.plans",
    "kiosk_agent.service.models.plans",  # billing plans' models
    "kiosk_agent.service.hpp",
    "kiosk_agent.service.models.hpp",  # hosted pages' models
    "kiosk_agent.service.models.reports",  # deposits, chargebacks, adjustments; ReportKind
    "kiosk_agent.sim",
    "kiosk_agent.admin",
    "prometheus_client",  # /metrics: loaded when the admin API starts
    "dateutil",
    "difflib",
]


def imported_by(modules: list[str]) -> set[str]:
    probe = f"import importlib, json, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
    probe += "print(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, timeout=60)
    return set(json.loads(done.stdout))


def test_a_run_imports_nothing_a_sale_does_not_need() -> None:
    loaded = imported_by(RUN)
    assert "kiosk_agent.sales.journal" in loaded  # the probe did import the agent
    for package in NOT_FOR_A_SALE:
        assert sorted(m for m in loaded if m == package or m.startswith(package + ".")) == []


def test_the_service_models_come_on_first_use() -> None:
    from kiosk_agent.service import models

    assert models.Merchant.__module__ == "kiosk_agent.service.models.boarding"
    assert models.ChargeRequest.__module__ == "kiosk_agent.service.models.payments"
    assert models.BillingPlan.__module__ == "kiosk_agent.service.models.plans"
    assert models.HostedPage.__module__ == "kiosk_agent.service.models.hpp"
    assert models.Deposit.__module__ == "kiosk_agent.service.models.reports"
