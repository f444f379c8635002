"""What a running agent imports: only what a sale needs (a Pi Zero pays for every module in
start-up time and memory). Boarding, reporting, the simulator and the admin page come on use."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.helpers import in_a_fresh_python

# What `kiosk-agent run` imports for an agent with a kiosk API trigger and no admin section:
# the run itself, up to claiming its journal (which this one cannot: its directory is a file).
# (Reporting's transactions and paging are not in the list: every start asks reporting for
# charges the journal cannot account for before it takes a customer, docs/journal.md. The report
# kinds a person pulls, deposits, chargebacks and adjustments, are.)
KIOSK_CONFIG = """\
service:
  base_url: http://127.0.0.1:9/
  reporting_url: http://127.0.0.1:9/
  ws_url: ws://127.0.0.1:9/
  mid: "1"
  api_key: !env_var FOOTPRINT_SECRET
  client_id: footprint
  client_secret: !env_var FOOTPRINT_SECRET
journal: {path: "%s"}
triggers:
  - platform: kiosk_api
    name: screen
    token: !env_var FOOTPRINT_SECRET
    port: 0
    terminal: SIM-0001
    products: {coffee: "2.50"}
terminals:
  - device_id: SIM-0001
"""
NOT_FOR_A_SALE = [
    "kiosk_agent.service.models.boarding",
    "kiosk_agent.service.boarding",
    "kiosk_agent.service.plans",
    "kiosk_agent.service.models.plans",  # billing plans' models
    "kiosk_agent.service.hpp",
    "kiosk_agent.service.models.hpp",  # hosted pages' models
    "kiosk_agent.service.models.reports",  # deposits, chargebacks, adjustments; ReportKind
    "kiosk_agent.sim",
    "kiosk_agent.cli.virtual",  # the `virtual` command; a run takes its machines from cli.embedded
    "kiosk_agent.cli.sim",  # the `sim` command
    "kiosk_agent.cli.sales",  # the `sales` command: its views and exports
    "kiosk_agent.cli.check_config",  # the `check-config` command: its warnings and summary
    "kiosk_agent.cli.service_access",  # a service command's settings and client
    "kiosk_agent.cli.waiting",  # the waiting line and a pull's progress: a run draws neither
    "kiosk_agent.config.mistakes",  # a configuration's mistakes explained: a valid one has none
    "kiosk_agent.export",  # CSV/JSON exports and printed records: a run prints none
    "kiosk_agent.platforms.mdb_protocol",  # the MDB adapter's wire: only with an mdb trigger
    "kiosk_agent.admin",
    "prometheus_client",  # /metrics: loaded when the admin API starts
    "dateutil",
    "resource",  # the servers' descriptor check reads the limit through os.sysconf
    "pkgutil",  # the platform registry asks for its platform by name, lists no package
    "difflib",
    "kiosk_agent.sales.fake_clock",  # the tests' clock: sales.clock hands it to them on use
    # flows no trigger of the configuration names (its kiosk API trigger's is charge_card):
    # imported by the runner when a sale first runs them
    "kiosk_agent.sales.authorize_capture",
    "kiosk_agent.sales.enroll",
    "kiosk_agent.sales.resolve",  # a person's decision on an ATTENTION sale: with admin: only
    "kiosk_agent.sales.recover_sale",  # one open sale driven to an end: when a start finds one
    "kiosk_agent.sales.reconcile",  # reporting asked about a sale's charges: at a first lookup
]


def imported_by_a_run(tmp_path: Path) -> set[str]:
    """Every module a `kiosk-agent run` of KIOSK_CONFIG imported before it stopped."""
    (tmp_path / "journal").write_text("a file, where the journal's directory should be")
    config = tmp_path / "kiosk.yaml"
    config.write_text(KIOSK_CONFIG % (tmp_path / "journal" / "journal.db"))
    probe = (
        "import contextlib, json, sys\n"
        "from kiosk_agent.cli import main\n"
        "with contextlib.suppress(SystemExit):\n"
        f"    main(['run', '--config', {str(config)!r}])\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    env = {**os.environ, "FOOTPRINT_SECRET": "footprint-secret-0123456789"}
    done = in_a_fresh_python(probe, env)
    assert "cannot claim the journal" in done.stderr  # stopped where it was meant to
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_a_run_imports_nothing_a_sale_does_not_need(tmp_path: Path) -> None:
    loaded = imported_by_a_run(tmp_path)
    assert {"kiosk_agent.sales.journal", "kiosk_agent.platforms.kiosk_api"} <= loaded  # a run
    for package in NOT_FOR_A_SALE:
        assert sorted(m for m in loaded if m == package or m.startswith(package + ".")) == []


def test_the_service_models_come_on_first_use() -> None:
    from kiosk_agent.service import models

    assert models.Merchant.__module__ == "kiosk_agent.service.models.boarding"
    assert models.ChargeRequest.__module__ == "kiosk_agent.service.models.payments"
    assert models.BillingPlan.__module__ == "kiosk_agent.service.models.plans"
    assert models.HostedPage.__module__ == "kiosk_agent.service.models.hpp"
    assert models.Deposit.__module__ == "kiosk_agent.service.models.reports"
    assert models.VaultAccountRequest.__module__ == "kiosk_agent.service.models.vault"


# Declared by no module an agent is assembled from (kiosk_agent.app and the sale flows, enroll's
# among them, which the runner imports when a trigger names them; and the service client): the
# vault's models, used by an enroll sale alone (some 3 ms of a start's CPU to declare, more to
# build after READY=1 with a sale's models).
VAULT_MODELS = ["VaultAccountRequest", "VaultPaymentAccount"]
MODELS_DECLARED = """\
import json, sys, kiosk_agent.app
from kiosk_agent.sales.runner import flow_class
from kiosk_agent.sales.model import Flow
for flow in Flow:
    flow_class(flow)
from pydantic import BaseModel
declared, pending = [], [BaseModel]
while pending:
    model = pending.pop()
    declared.append(model.__qualname__)
    pending.extend(model.__subclasses__())
print(json.dumps({"modules": sorted(sys.modules), "models": sorted(declared)}))
"""


def test_the_agents_modules_declare_no_vault_model() -> None:
    done = in_a_fresh_python(MODELS_DECLARED)
    found = json.loads(done.stdout.splitlines()[-1])
    assert {"kiosk_agent.sales.enroll", "kiosk_agent.service.models.payments"} <= set(
        found["modules"]
    )
    assert "ChargeRequest" in found["models"]  # a sale's models are declared
    assert sorted(set(VAULT_MODELS) & set(found["models"])) == []
    assert "kiosk_agent.service.models.vault" not in found["modules"]


def test_building_the_models_a_start_uses_parses_no_builtins_signature() -> None:
    # pydantic reads each default factory's signature; a builtin's (list) is parsed by the
    # tokenizer, whose patterns compile on first use: milliseconds before the first charge check
    probe = (
        "import json, tokenize\n"
        "from kiosk_agent.service.models import reporting, terminal\n"
        "for module in (reporting, terminal):\n"
        "    for model in vars(module).values():\n"
        "        if getattr(model, '__module__', '') == module.__name__ and "
        "hasattr(model, 'model_rebuild'):\n"
        "            model.model_rebuild(force=True)\n"
        "print(json.dumps(tokenize._compile.cache_info().misses))\n"
    )
    done = in_a_fresh_python(probe)
    assert json.loads(done.stdout) == 0


def test_the_agents_modules_leave_the_health_sections_schema_to_a_configuration_that_has_one(
) -> None:
    # imported after the journal is claimed (past imported_by_a_run's stop): the agent reads the
    # section's defaults as plain numbers; config.load imports the schema for a health: section
    probe = (
        "import json, sys\n"
        "import kiosk_agent.app\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('kiosk_agent.'))))\n"
    )
    done = in_a_fresh_python(probe)
    loaded = set(json.loads(done.stdout))
    assert "kiosk_agent.assembly.agent" in loaded
    assert "kiosk_agent.health.schema" not in loaded


def test_the_agents_modules_look_up_no_codec_and_leave_the_tests_clock_out() -> None:
    # the boot id is read as bytes: a text file opened with encoding="ascii" looks the codec up
    # by name, and imported encodings.ascii into every run for that one read
    probe = (
        "import json, sys\n"
        "before = set(sys.modules)\n"
        "import kiosk_agent.app\n"
        "from kiosk_agent.sales.clock import SYSTEM_CLOCK\n"
        "print(json.dumps({'boot': SYSTEM_CLOCK.boot_id(),\n"
        "                  'new': sorted(set(sys.modules) - before)}))\n"
    )
    done = in_a_fresh_python(probe)
    found = json.loads(done.stdout.splitlines()[-1])
    assert "kiosk_agent.sales.clock" in found["new"]
    assert [m for m in found["new"] if m.startswith("encodings.")] == []
    assert "kiosk_agent.sales.fake_clock" not in found["new"]
    if Path("/proc/sys/kernel/random/boot_id").exists():  # read as before: its text, stripped
        assert found["boot"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_the_tests_clock_is_where_the_tests_take_it() -> None:
    from kiosk_agent.sales import clock, fake_clock

    assert clock.FakeClock is fake_clock.FakeClock
    assert clock.FakeClock().boot_id() == "fake-boot-1"


def test_a_flow_a_trigger_names_is_loaded_with_the_agent_and_no_other(tmp_path: Path) -> None:
    # the runner imports a flow's module when a sale first runs it; a flow the configuration
    # names is imported as the agent is assembled, so its first customer does not wait for it
    config = tmp_path / "kiosk.yaml"
    config.write_text(
        KIOSK_CONFIG.replace("port: 0\n", "port: 0\n    flow: authorize_capture\n")
        % (tmp_path / "journal.db")
    )
    probe = (
        "import json, sys\n"
        "from kiosk_agent.app import load_agent\n"
        f"agent = load_agent({str(config)!r}, systemd=False)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('kiosk_agent.sales.'))))\n"
    )
    env = {**os.environ, "FOOTPRINT_SECRET": "footprint-secret-0123456789"}
    loaded = set(json.loads(in_a_fresh_python(probe, env).stdout.splitlines()[-1]))
    assert "kiosk_agent.sales.authorize_capture" in loaded
    assert not {"kiosk_agent.sales.charge_card", "kiosk_agent.sales.enroll"} & loaded
