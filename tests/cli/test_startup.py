"""The command line answers at once: ``--version`` imports nothing of the agent, ``--help``
imports no command module, and a command's ``--help`` and shell completion build the parser
without the libraries and modules the commands run on (on a Pi Zero each heavy import costs a
field tech seconds)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiosk_agent import __version__
from kiosk_agent.cli import COMMAND_HELP, COMMAND_MODULES, build_parser, contract
from tests.helpers import in_a_fresh_python

DEMO_CONFIG = Path(__file__).parents[2] / "config" / "demo.yaml"

HEAVY = ("aiohttp", "kiosk_agent.sim", "kiosk_agent.admin", "kiosk_agent.assembly", "pydantic")


# What a parser may be built from: the command modules, the contract and these small modules
# of plain data (states, amounts, the MDB wire's units, the timeout default, the moments' forms).
PARSER_MODULES = {
    "kiosk_agent", "kiosk_agent.cli", "kiosk_agent.export", "kiosk_agent.money",
    "kiosk_agent.service", "kiosk_agent.service.timeouts", "kiosk_agent.sales",
    "kiosk_agent.sales.states", "kiosk_agent.sales.kinds", "kiosk_agent.sales.model",
    "kiosk_agent.platforms",
    "kiosk_agent.platforms.mdb_protocol", "kiosk_agent.platforms.mdb_units", "kiosk_agent.tasks",
    "kiosk_agent.moments", "kiosk_agent.data_class",
    "kiosk_agent.pydantic_setup",  # a finder for pydantic's plugin loader: imports nothing
    "kiosk_agent.aiohttp_setup",  # a finder for aiohttp's connector: imports nothing
}  # fmt: skip
LIBRARIES = ("aiohttp", "pydantic", "yaml", "voluptuous", "serial", "aiomqtt", "sqlite3")


def modules_after(*argvs: list[str]) -> tuple[str, set[str]]:
    """Run ``kiosk-agent ARGV`` for each ARGV in one fresh Python; the output and every module
    imported by them all."""
    probe = (
        "import contextlib, io, json, sys\n"
        "from kiosk_agent.cli import main\n"
        "out = io.StringIO()\n"
        f"for argv in {list(argvs)!r}:\n"
        "    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "        main(argv)\n"
        "print(json.dumps([out.getvalue(), sorted(sys.modules)]))\n"
    )
    done = in_a_fresh_python(probe)
    output, modules = json.loads(done.stdout.splitlines()[-1])
    return output, set(modules)


def imported(modules: set[str], package: str) -> list[str]:
    return sorted(m for m in modules if m == package or m.startswith(package + "."))


def test_version_imports_neither_aiohttp_nor_the_simulator_nor_the_admin_page() -> None:
    output, modules = modules_after(["--version"])
    assert output == f"kiosk-agent {__version__}\n"
    for package in HEAVY:
        assert imported(modules, package) == [], package
    assert imported(modules, "kiosk_agent.cli") == ["kiosk_agent.cli"]


@pytest.mark.parametrize("argv", [["--help"], []])
def test_the_overview_imports_no_command_module(argv: list[str]) -> None:
    output, modules = modules_after(argv)
    assert "check-config" in output
    assert "completion" in output
    for package in ("aiohttp", "kiosk_agent.sim", "kiosk_agent.admin", "kiosk_agent.assembly"):
        assert imported(modules, package) == [], package
    assert imported(modules, "kiosk_agent.cli") == ["kiosk_agent.cli", "kiosk_agent.cli.contract"]


def test_the_overview_says_of_each_command_what_its_module_does() -> None:
    registered = {}
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            registered = {choice.dest: choice.help for choice in action._choices_actions}
    assert registered == COMMAND_HELP
    assert set(COMMAND_MODULES) == set(COMMAND_HELP)


def test_no_help_and_no_completion_script_waits_for_what_the_commands_run_on() -> None:
    # one process for all: what none of them imports, no single one does
    helps = [[name, "--help"] for name in COMMAND_HELP]
    scripts = [["completion", shell] for shell in ("bash", "zsh", "fish")]
    output, modules = modules_after(*helps, *scripts)
    assert "-F _kiosk_agent_complete kiosk-agent" in output  # bash
    assert "complete -c kiosk-agent" in output  # fish
    assert "usage: kiosk-agent sales" in output
    for library in LIBRARIES:
        assert imported(modules, library) == [], library
    ours = {m for m in modules if m.startswith("kiosk_agent")}
    ours -= set(imported(modules, "kiosk_agent.cli"))
    assert ours <= PARSER_MODULES, sorted(ours - PARSER_MODULES)


def test_a_commands_help_does_not_start_asyncio() -> None:
    output, modules = modules_after(["terminals", "--help"], ["run", "--help"])
    assert "usage: kiosk-agent terminals" in output
    assert imported(modules, "asyncio") == []


def test_the_completion_scripts_run_no_python_on_tab() -> None:
    # static scripts: a Tab on a Pi Zero must not wait for Python to start (a dynamic script
    # would call the program back: `$(kiosk-agent ...)` in bash and zsh, `(kiosk-agent ...)`
    # in fish)
    output, _modules = modules_after(*(["completion", shell] for shell in ("bash", "zsh", "fish")))
    assert "_kiosk_agent_complete()" in output
    assert "(kiosk-agent" not in output
    assert "python" not in output


def test_a_command_does_not_search_the_installed_packages_for_pydantic_plugins() -> None:
    # every entry-point search the process makes is recorded; check-config builds models
    probe = (
        "import importlib.metadata as metadata, sys\n"
        "asked = []\n"
        "real = metadata.entry_points\n"
        "def recorded(**selection):\n"
        "    asked.append(selection.get('group'))\n"
        "    return real(**selection)\n"
        "metadata.entry_points = recorded\n"
        "from kiosk_agent.cli import main\n"
        "code = main(['check-config', '--config', sys.argv[1]])\n"
        "print('pydantic' in asked, code)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    done = subprocess.run(
        [sys.executable, "-c", probe, str(DEMO_CONFIG)],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )
    assert done.stdout.splitlines()[-1].split() == ["False", "0"], done.stdout + done.stderr


# A unit's configuration with every section a command reads when it checks one: the admin API's,
# the webhook receiver's, health's and upstream's are each checked by a schema module of its own.
UNIT_CONFIG = """\
service:
  simulator: {time_scale: 300}
terminals: [{device_id: SIM-0001, name: front}]
journal: {path: journal.db}
admin:
  tokens: [{name: tech, token: !env_var KIOSK_TEST_ADMIN_TOKEN}]
webhooks: {secret: !env_var KIOSK_TEST_WEBHOOK_SECRET}
health: {ping_interval: 30}
upstream: {device_id: unit-1, mqtt: {host: 127.0.0.1}}
"""
# What a command that reads a file or the journal must not wait for: the servers, the health
# model, the service's models, the simulator (aiohttp and pydantic come with them).
SERVERS = ("aiohttp", "pydantic", "kiosk_agent.admin.server", "kiosk_agent.admin.page",
           "kiosk_agent.admin.webhooks", "kiosk_agent.health.model", "kiosk_agent.sim",
           "kiosk_agent.service.models")


def test_check_config_and_sales_import_no_server_and_no_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`check-config` imported the admin server (aiohttp, the status page) and the health
    model (pydantic) to check the sections: 0.6-1.2 s a command on a 2-core machine. `sales
    show` imported them through the attention sweeper and the card brands' names: 0.52 s of
    CPU against 0.31 s for `sales` on a journal of 200,000 sales."""
    from kiosk_agent.sales.journal import Journal, SaleRecord
    from kiosk_agent.sales.states import SaleState

    config = tmp_path / "config.yaml"
    config.write_text(UNIT_CONFIG)
    monkeypatch.setenv("KIOSK_TEST_ADMIN_TOKEN", "t" * 24)
    monkeypatch.setenv("KIOSK_TEST_WEBHOOK_SECRET", "s" * 24)
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    journal.create(SaleRecord("5a1e", "KA000000000000000001", "virtual:front", "charge_card",
                              "SIM-0001", 250, SaleState.STARTED, card_brand="1"))
    journal.close()
    output, modules = modules_after(["check-config", str(config)], ["sales", "-c", str(config)],
                                    ["sales", "attention", "-c", str(config)],
                                    ["sales", "show", "5a", "-c", str(config)])
    assert f"{config}: valid" in output
    assert "0 sales in attention" in output
    assert "Visa" in output  # the sale shown, its card brand named
    for package in SERVERS:
        assert imported(modules, package) == [], package


def unit_with_a_sale_in_attention(tmp_path: Path) -> Path:
    """A unit's configuration (the simulator, journal.db beside it) whose journal holds one
    sale, 5a1e, in attention (its charge's answer unknown): what the sales commands read."""
    from kiosk_agent.sales.journal import Journal, SaleRecord
    from kiosk_agent.sales.states import SaleState, Step

    config = tmp_path / "config.yaml"
    config.write_text("service: {simulator: {}}\nterminals: [{device_id: SIM-0001}]\n"
                      "journal: {path: journal.db}\n")
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    sale = journal.create(SaleRecord("5a1e", "KA000000000000000001", "virtual:front",
                                     "charge_card", "SIM-0001", 250, SaleState.STARTED))
    sale = journal.record(sale, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)
    journal.record(sale, Step.CHARGE_CARD_UNKNOWN, SaleState.ATTENTION)
    journal.close()
    return config


def test_the_sales_commands_start_no_event_loop(tmp_path: Path) -> None:
    """`sales` and its actions read or write the journal and never wait: they ran in an event
    loop all the same, and asyncio's import (ssl, subprocess and concurrent.futures with it) was
    a third of the command's CPU at its start."""
    config = unit_with_a_sale_in_attention(tmp_path)
    output, modules = modules_after(
        ["sales", "-c", str(config)], ["sales", "list", "--json", "-c", str(config)],
        ["sales", "attention", "-c", str(config)], ["sales", "show", "5a", "-c", str(config)],
        ["sales", "show", "nothing-like-it", "-c", str(config)],  # a refusal, too
    )
    assert "1 sale in attention" in output
    assert "charge_card.unknown      -> attention" in output  # the sale shown with its steps
    for package in ("asyncio", "ssl", "subprocess", "concurrent.futures"):
        assert imported(modules, package) == [], package
    # resolving writes the journal through the attention module (the sweeper's, which imports
    # the sale steps and asyncio with them) and waits for nothing either
    output, _modules = modules_after(["sales", "resolve", "5a1e", "--as", "reversed", "--why",
                                      "refunded by hand", "-c", str(config)])
    assert "resolved as reversed" in output


def test_a_handler_registered_without_a_loop_that_waits_is_named() -> None:
    import asyncio

    from kiosk_agent.cli.contract import guarded, run_without_loop

    async def waits(args: argparse.Namespace) -> int:
        await asyncio.sleep(0)
        return 0

    async def answers(args: argparse.Namespace) -> int:
        return 3

    assert run_without_loop(guarded(answers, loop=False), argparse.Namespace()) == 3
    with pytest.raises(RuntimeError, match="waits waited for an event loop"):
        run_without_loop(guarded(waits, loop=False), argparse.Namespace())


@pytest.mark.parametrize("command", ["doctor", "health", "fleet", "check-config", "sales"])
def test_a_commands_help_waits_for_no_event_loop(command: str) -> None:
    """`doctor --help` imported asyncio with its module (cli/fleet.py)."""
    output, modules = modules_after([command, "--help"])
    assert f"usage: kiosk-agent {command}" in output
    assert imported(modules, "asyncio") == []


def test_health_asks_the_agent_without_aiohttp(monkeypatch: pytest.MonkeyPatch) -> None:
    """`health` asks one question: aiohttp's import was a quarter of a second of CPU of its
    0.8 s here (more than the rest of the command); the standard library asks as well."""
    monkeypatch.setenv("KIOSK_AGENT_TOKEN", "t" * 24)
    _output, modules = modules_after(["health", "--url", "http://127.0.0.1:9", "--timeout", "2"])
    for package in ("aiohttp", "kiosk_agent.admin.server", "kiosk_agent.sim", "pydantic"):
        assert imported(modules, package) == [], package
    # nor an event loop for its one question, nor the doctor's checks for the words of a
    # refused connection (they imported asyncio): a third of the command's CPU; nor, for a
    # plain http:// agent, http.client with ssl and the e-mail parser (a tenth of its CPU)
    for package in ("asyncio", "kiosk_agent.doctor", "http.client", "ssl", "email"):
        assert imported(modules, package) == [], package


@contextlib.contextmanager
def an_agent_answering(snapshot: dict[str, object]) -> Iterator[str]:
    """A stand-in for a running agent's admin API on a loopback port: every GET answers
    ``snapshot`` (what `health` asks); its address."""
    import http.server
    import threading

    class Agent(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(snapshot).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Agent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_health_says_the_readers_without_the_status_pages_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent's answer that names its readers (``availability``) had `health` import the
    status page (admin/page.py, with aiohttp's server and the agent's health model) for its
    one line "cards: 1 of 1 reader can take cards": 1.2 s of CPU of a 6.6 s answer on the
    bench's loaded machine, against 0.3 s. The words are health/readers.py's now."""
    snapshot = {"status": "ok", "version": "x", "uptime_s": 5, "service": {"reachable": True},
                "sales": {}, "terminals": [{"device_id": "SIM-0001", "online": True}],
                "availability": [{"device_id": "SIM-0001", "available": True}], "problems": []}
    monkeypatch.setenv("KIOSK_AGENT_TOKEN", "t" * 24)
    with an_agent_answering(snapshot) as url:
        output, modules = modules_after(["health", "--url", url, "--timeout", "5"])
    assert "cards:    1 of 1 reader can take cards" in output
    for package in ("aiohttp", "kiosk_agent.admin", "kiosk_agent.health.model", "asyncio"):
        assert imported(modules, package) == [], package


# What checking the ``sales:`` and ``receipts:`` sections once imported with their defaults
# (sales/settings.py): the sale's model and states, the receipts, the service's errors, the
# redaction's patterns and logging with them
SALE_DOMAIN = ("kiosk_agent.sales.settings", "kiosk_agent.sales.model",
               "kiosk_agent.sales.states", "kiosk_agent.sales.receipts",
               "kiosk_agent.service.errors", "kiosk_agent.redact", "logging")


def test_health_reads_its_config_without_the_sale_domains_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`health -c FILE` reads the admin API's address and token from the configuration, which
    it checks whole: the ``sales:`` section's defaults came from sales/settings.py, and with
    them the modules of SALE_DOMAIN, a fifth of the command's CPU (297 -> 252 ms median of 20
    alternating runs at load 13; 2026-11-29). They are plain numbers in sales/defaults.py now;
    the sections are checked as before (a wrong value is still refused)."""
    snapshot = {"status": "ok", "version": "x", "uptime_s": 5, "service": {"reachable": True},
                "sales": {}, "terminals": [], "problems": []}
    monkeypatch.setenv("KIOSK_TEST_ADMIN_TOKEN", "t" * 24)
    with an_agent_answering(snapshot) as url:
        port = url.rsplit(":", 1)[1]
        config = tmp_path / "config.yaml"
        config.write_text(
            "service: {simulator: {}}\nterminals: [{device_id: SIM-0001}]\n"
            "sales: {vend_timeout: 30, currency: eur}\nreceipts: {print: never}\n"
            f"admin: {{port: {port}, tokens: [{{name: tech, token: !env_var "
            "KIOSK_TEST_ADMIN_TOKEN}]}\n")
        output, modules = modules_after(["health", "-c", str(config)])
        assert "status:   OK" in output
        assert "kiosk_agent.sales.schema" in modules  # the sections were checked
        for module in SALE_DOMAIN:
            assert module not in modules, module
        config.write_text(config.read_text().replace("print: never", "print: sometimes"))
        refused = subprocess.run([sys.executable, "-m", "kiosk_agent", "health", "-c",
                                  str(config)], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0
    assert "receipts.print" in refused.stderr
    assert "status:" not in refused.stdout


def test_a_question_asked_without_an_event_loop_gives_up_at_its_bound() -> None:
    import threading
    import time

    from kiosk_agent.cli.waiting import wait_in_thread

    never = threading.Event()
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"no answer within 0\.2 s"):
        wait_in_thread("an agent that never answers", 0.2, never.wait)
    assert time.monotonic() - started < 5
    never.set()
    assert wait_in_thread("an answer", 5, lambda: 42) == 42
    with pytest.raises(ConnectionRefusedError):
        wait_in_thread("a refusal", 5, lambda: (_ for _ in ()).throw(
            ConnectionRefusedError(111, "refused")))


def test_a_command_on_a_config_with_a_dex_section_does_not_wait_for_the_eva_dts_reader() -> None:
    """The `dex:` section's schema is a module of kiosk_agent.audit, whose package imported the
    EVA-DTS reader (some twenty dataclasses) for its contract's names: about a sixth of the
    imports of `sales` on config/demo.yaml. They are imported on first use now."""
    _output, modules = modules_after(["sales", "-c", str(DEMO_CONFIG)],
                                     ["sales", "attention", "-c", str(DEMO_CONFIG)])
    assert "kiosk_agent.audit.schema" in modules  # the section was checked
    assert imported(modules, "kiosk_agent.audit.evadts") == []


def test_checking_a_dex_section_loads_no_link_no_codec_and_no_serial(tmp_path: Path) -> None:
    """The `dex:` section's schema takes its defaults from audit/link_settings.py, plain data:
    the link, its two codecs, pyserial and the serial platforms' base stay unloaded (they were
    most of check-config's CPU on config/demo.yaml)."""
    config = tmp_path / "c.yaml"
    config.write_text("service: {simulator: {}}\nterminals: [{device_id: SIM-0001}]\n"
                      "journal: {path: journal.db}\ndex: {port: /dev/ttyUSB0}\n")
    output, modules = modules_after(["check-config", "-c", str(config)])
    assert "valid" in output
    assert "kiosk_agent.audit.schema" in modules  # the section was checked
    for module in ("kiosk_agent.audit.link", "kiosk_agent.audit.dexucs",
                   "kiosk_agent.audit.ddcmp", "kiosk_agent.platforms.serial", "serial"):
        assert imported(modules, module) == [], module


# A unit with a vending machine on an MDB adapter, the demo's virtual machine, a line-based
# serial device and buttons on GPIO: each platform's schema (and gpio's check of the machine) is
# read from its `<name>_schema` module.
TRIGGERS_CONFIG = """\
service: {simulator: {}}
terminals: [{device_id: SIM-0001, name: front}]
journal: {path: journal.db}
triggers:
  - {platform: mdb, name: snacks, port: /dev/ttyUSB0, terminal: front}
  - {platform: virtual, name: coffee, terminal: front, mode: card_first,
     flow: authorize_capture, products: {K1: "1.80"}}
  - {platform: serial_line, name: lockers, port: /dev/ttyUSB1, terminal: front,
     vend_request: 'VEND (?P<price>[0-9.]+)', dispense_ok: 'OK', approve: 'GO {cents}'}
  - {platform: gpio, name: kiosk, terminal: front,
     buttons: [{line: 17, product: espresso, price: "2.50", relay: 22}]}
"""
# What checking those triggers must not wait for: the platforms' runtime (the adapter link,
# the machine's driver), pyserial, asyncio (ssl and subprocess come with it).
PLATFORM_RUNTIME = ("asyncio", "ssl", "subprocess", "serial", "serial_asyncio_fast",
                    "kiosk_agent.platforms.mdb", "kiosk_agent.platforms.virtual",
                    "kiosk_agent.platforms.serial_line", "kiosk_agent.platforms.gpio",
                    "kiosk_agent.platforms.serial", "kiosk_agent.platforms.base",
                    "kiosk_agent.health.availability", "kiosk_agent.bus",
                    "kiosk_agent.platforms.mdb_protocol",  # the wire's dataclasses
                    "kiosk_agent.verdicts")  # the doctor's verdicts: warnings need none


def test_check_config_checks_the_triggers_without_their_platforms_runtime(
    tmp_path: Path,
) -> None:
    """`check-config` imported asyncio through the `virtual` platform's module (and the MDB
    link, pyserial and the availability bus with it): a third of its CPU on config/demo.yaml,
    to read a schema. The doctor's trigger warnings did too."""
    config = tmp_path / "c.yaml"
    config.write_text(TRIGGERS_CONFIG)
    output, modules = modules_after(["check-config", str(config)],
                                    ["check-config", str(DEMO_CONFIG)])
    assert f"{config}: valid" in output
    assert "triggers:  snacks, coffee, lockers, kiosk" in output
    assert {"kiosk_agent.platforms.mdb_schema", "kiosk_agent.platforms.virtual_schema",
            "kiosk_agent.platforms.serial_line_schema",
            "kiosk_agent.platforms.gpio_schema"} <= modules
    for package in PLATFORM_RUNTIME:
        assert package not in modules, package
    # a mistake in a trigger is still found, at its line
    config.write_text(TRIGGERS_CONFIG.replace("mode: card_first", "mode: card_last"))
    done = subprocess.run([sys.executable, "-m", "kiosk_agent", "check-config", str(config)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "c.yaml:6: triggers[1].mode: value must be one of" in done.stderr


def test_the_audit_packages_contract_names_are_still_there_on_first_use() -> None:
    import kiosk_agent.audit as audit

    for name in audit.__all__:
        assert getattr(audit, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'parse_dex'"):
        audit.parse_dex  # noqa: B018  (a name the contract does not have)


def test_a_command_runs_with_no_parser_left(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A run lives for months: once the command line is parsed, no argparse parser is kept (the
    command's, the leaf the contract check read, the contract's shared option parsers)."""
    import gc

    from kiosk_agent.cli import check_config, main

    def parsers() -> int:
        gc.collect()
        return sum(isinstance(o, argparse.ArgumentParser) for o in gc.get_objects())

    alive: list[int] = []

    async def counting(args: argparse.Namespace) -> int:
        alive.append(parsers())
        return 0

    monkeypatch.setattr(check_config, "check_config_command", counting)
    contract.forget_parsers()  # what earlier tests of this process built and the cache kept
    before = parsers()  # pytest's own
    assert main(["check-config", "--json", str(tmp_path / "config.yaml")]) == 0
    assert alive == [before]


def test_a_read_command_ends_its_process_without_the_interpreters_teardown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once its handler is done (the journal closed, the output written), a command without an
    event loop ends its own process at once: the interpreter's teardown (each module's objects
    freed one by one, what the kernel does at once) was 11-13 ms of the 100 ms of CPU of
    `kiosk-agent sales` on a year's journal. Its output and exit code are as before, a failure's
    words too; called in a process of another's (``main(argv)``), it returns."""
    from kiosk_agent.cli import main

    config = unit_with_a_sale_in_attention(tmp_path)

    def own_process(*argv: str) -> subprocess.CompletedProcess[str]:
        probe = (
            "import atexit, sys\n"
            "atexit.register(lambda: print('torn down', file=sys.stderr))\n"
            "from kiosk_agent.cli import main\n"
            f"sys.argv = ['kiosk-agent', *{list(argv)!r}, '-c', {str(config)!r}]\n"
            "sys.exit(main())\n"
        )
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=60, check=False)

    waiting = main(["sales", "attention", "-c", str(config)])  # another's process: returns
    assert "1 sale in attention" in capsys.readouterr().out
    listed = own_process("sales", "attention")
    assert (listed.returncode, listed.stderr) == (waiting, "")  # no teardown ran: nothing said
    assert "1 sale in attention" in listed.stdout
    refused = own_process("sales", "show", "nothing-like-it")
    assert refused.returncode == main(["sales", "show", "nothing-like-it", "-c", str(config)])
    assert refused.returncode != 0
    assert "torn down" not in refused.stderr
    assert "nothing-like-it" in refused.stderr  # its words, written before the end


def test_health_says_what_to_run_next_without_the_demos_modules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A health that is not ok ends with what to run next (`next:` lines, 2026-11-30
    i42-newcomer), by what it holds; saying how this program is run (`program_command`) is
    the contract's, so the answer a tech waits for when a reader is down imports neither the
    demo's modules (the live view, its tasks) nor aiohttp."""
    snapshot = {"status": "down", "version": "x", "uptime_s": 5,
                "service": {"reachable": True},
                "sales": {"attention": 1, "late_vends": 1},
                "terminals": [{"device_id": "SIM-0001", "online": False}],
                "availability": [{"device_id": "SIM-0001", "available": False,
                                  "reason": "terminal offline", "since": 0.0}],
                "problems": ["terminal SIM-0001 offline"]}
    monkeypatch.setenv("KIOSK_AGENT_TOKEN", "t" * 24)
    with an_agent_answering(snapshot) as url:
        output, modules = modules_after(["health", "--url", url, "--timeout", "5"])
    steps = [line for line in output.splitlines() if line.startswith("next:")]
    assert len(steps) == 3, output
    assert " doctor -c FILE` checks each part and says how to fix what fails" in steps[0]
    assert " sales attention -c FILE` lists the sales a person decides" in steps[1]
    assert " sales late-vends -c FILE`: check the stock, then acknowledge them" in steps[2]
    for package in ("aiohttp", "kiosk_agent.cli.demo"):
        assert imported(modules, package) == [], package
