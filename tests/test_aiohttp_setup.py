"""aiohttp's TLS context that checks no certificate is made without the system's trust store
(kiosk_agent/aiohttp_setup.py): loading it there cost every start 24-26 ms of CPU here for a
store nothing reads. The context that verifies keeps it, and a request still verifies."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from kiosk_agent import aiohttp_setup

# A process that imports aiohttp the way a command does, then says what its contexts hold.
IMPORT_AIOHTTP = """\
import json, ssl, sys
from kiosk_agent.aiohttp_setup import skip_unverified_trust_store
print(json.dumps(skip_unverified_trust_store()))
import aiohttp
from aiohttp import connector
later = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
later.check_hostname = False
later.verify_mode = ssl.CERT_NONE
later.set_default_verify_paths()
print(json.dumps({
    "verified": connector._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"],
    "unverified": connector._SSL_CONTEXT_UNVERIFIED.cert_store_stats()["x509_ca"],
    "unverified_mode": int(connector._SSL_CONTEXT_UNVERIFIED.verify_mode),
    "a_default_context": ssl.create_default_context().cert_store_stats()["x509_ca"],
    "a_later_unverified_context": later.cert_store_stats()["x509_ca"],
    "method_put_back": "set_default_verify_paths" not in vars(ssl.SSLContext),
    "finder_gone": not any(type(f).__module__ == "kiosk_agent.aiohttp_setup"
                           for f in sys.meta_path),
}))
print(json.dumps(skip_unverified_trust_store()))
"""


def contexts_after_import(program: str = IMPORT_AIOHTTP) -> list[object]:
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
        cwd=Path(__file__).parents[1], env=os.environ.copy(), check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_the_context_that_verifies_nothing_holds_no_trust_store_and_the_other_all_of_it() -> None:
    asked, held, again = contexts_after_import()
    assert asked is True
    assert again is False  # aiohttp's connector is imported: nothing more to do
    assert held["unverified_mode"] == ssl.CERT_NONE
    assert held["unverified"] == 0
    # the verifying context loads the store as aiohttp has it (a machine may have none: the
    # same count as a default context of the standard library's either way)
    assert held["verified"] == held["a_default_context"]
    # the standard library's method is back as the connector's body ends, the finder gone
    assert held["method_put_back"] is True
    assert held["finder_gone"] is True
    assert held["a_later_unverified_context"] == held["a_default_context"]


def test_without_it_aiohttp_loads_the_store_into_both() -> None:
    """What the stand-in saves: aiohttp's own import loads the store twice where it has one."""
    plain = IMPORT_AIOHTTP.replace("skip_unverified_trust_store()", "False")
    _, held, _ = contexts_after_import(plain)
    if not held["a_default_context"]:
        pytest.skip("this machine has no trust store to load")
    assert held["unverified"] == held["verified"] == held["a_default_context"]


def test_an_imported_connector_is_left_as_it_is() -> None:
    assert aiohttp.connector is sys.modules[aiohttp_setup.CONNECTOR]
    finders = list(sys.meta_path)
    assert aiohttp_setup.skip_unverified_trust_store() is False
    assert sys.meta_path == finders


def test_every_command_makes_it_so() -> None:
    """The command line sets it up before a command runs (cli/__init__.py's main)."""
    config = Path(__file__).parents[1] / "config" / "demo.yaml"
    program = (
        "import contextlib, io, json\n"
        "from kiosk_agent.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main(['check-config', {str(config)!r}])\n"
        "from aiohttp import connector\n"
        "print(json.dumps([connector._SSL_CONTEXT_UNVERIFIED.cert_store_stats()['x509_ca'],\n"
        "                  connector._SSL_CONTEXT_VERIFIED.cert_store_stats()['x509_ca']]))\n"
    )
    (unverified, verified), *_ = contexts_after_import(program)
    assert unverified == 0
    assert verified == ssl.create_default_context().cert_store_stats()["x509_ca"]
