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
from typing import Any

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
    # same count as a default context of the standard library's either way), or, where the
    # system's hashed directory holds every certificate of its bundle, the directory alone,
    # read by name at a handshake (none parsed yet)
    assert held["verified"] == system_store_parsed()
    # the standard library's method is back as the connector's body ends, the finder gone
    assert held["method_put_back"] is True
    assert held["finder_gone"] is True
    assert held["a_later_unverified_context"] == held["a_default_context"]


def system_store_parsed() -> int:
    """The certificates aiohttp's verifying context holds parsed after its import with the
    stand-in, on this machine: none where its directory holds its bundle, all of them else."""
    if aiohttp_setup.bundle_directory(ssl.get_default_verify_paths()) is not None:
        return 0
    return int(ssl.create_default_context().cert_store_stats()["x509_ca"])


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
    assert verified == system_store_parsed()


# -- attacked: a real TLS server, another thread inside the window, an import that fails ------

# A process that sets the stand-in up, imports aiohttp, serves two certificates over TLS on
# 127.0.0.1 (one signed by the test's CA, which SSL_CERT_FILE makes the trust store, one signed
# by nobody) and says what aiohttp's requests and the MQTT client's context made of each.
VERIFY_REQUESTS = """\
import asyncio, json, ssl, sys
from kiosk_agent.aiohttp_setup import skip_unverified_trust_store
assert skip_unverified_trust_store()
import aiohttp
from aiohttp import web
from kiosk_agent.fleet.mqtt import mqtt_tls_context

directory = sys.argv[1]

async def serve(cert: str, key: str) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_get("/", lambda request: web.Response(text="here"))
    runner = web.AppRunner(app)
    await runner.setup()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(f"{directory}/{cert}", f"{directory}/{key}")
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]

async def get(port: int, **options: object) -> str:
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"https://127.0.0.1:{port}/", **options) as response:
                return await response.text()
    except aiohttp.ClientConnectorCertificateError:
        return "refused: certificate"

async def tls(port: int, context: ssl.SSLContext) -> str:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                  server_hostname="127.0.0.1")
    except ssl.SSLCertVerificationError:
        return "refused: certificate"
    writer.close()
    return "connected"

async def main() -> None:
    signed, signed_port = await serve("server.crt", "server.key")
    alone, alone_port = await serve("alone.crt", "alone.key")
    try:
        store = mqtt_tls_context({"tls": True})
        own_ca = mqtt_tls_context({"tls": True, "ca_file": f"{directory}/ca.crt"})
        print(json.dumps({
            "signed": await get(signed_port),
            "self_signed": await get(alone_port),
            "self_signed_unverified": await get(alone_port, ssl=False),
            "mqtt_store_signed": await tls(signed_port, store),
            "mqtt_store_self_signed": await tls(alone_port, store),
            "mqtt_ca_file_signed": await tls(signed_port, own_ca),
            "mqtt_ca_file_self_signed": await tls(alone_port, own_ca),
        }))
    finally:
        await signed.cleanup()
        await alone.cleanup()

asyncio.run(main())
"""


def _certificates(directory: Path) -> Path:
    """The fleet tests' throwaway CA and a certificate it signed for 127.0.0.1, and one for
    127.0.0.1 that no CA signed (alone.crt)."""
    from tests.fleet.helpers import make_certificates

    ca = make_certificates(directory)
    (directory / "alone.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", "alone.key", "-out", "alone.crt", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        cwd=directory, check=True, capture_output=True,
    )  # fmt: skip
    return ca


def _run(program: str, *args: str, env: dict[str, str] | None = None) -> list[Any]:
    done = subprocess.run(
        [sys.executable, "-c", program, *args], capture_output=True, text=True, timeout=60,
        cwd=Path(__file__).parents[1], env=env or os.environ.copy(), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_a_request_still_verifies_the_servers_certificate_against_the_trust_store(
    tmp_path: Path,
) -> None:
    """A real TLS server on 127.0.0.1: a certificate signed by a CA the trust store holds (the
    test's own, made the store by SSL_CERT_FILE) is taken, one signed by nobody refused, by
    aiohttp's requests and by the MQTT client's context (the store, or the ``ca_file`` the
    config names) alike; only ``ssl=False`` (which no request of the program asks) takes it."""
    ca = _certificates(tmp_path)
    env = {**os.environ, "SSL_CERT_FILE": str(ca), "SSL_CERT_DIR": str(tmp_path / "none")}
    (seen,) = _run(VERIFY_REQUESTS, str(tmp_path), env=env)
    assert seen == {
        "signed": "here",
        "self_signed": "refused: certificate",
        "self_signed_unverified": "here",
        "mqtt_store_signed": "connected",
        "mqtt_store_self_signed": "refused: certificate",
        "mqtt_ca_file_signed": "connected",
        "mqtt_ca_file_self_signed": "refused: certificate",
    }


# Another thread makes a context that verifies nothing yet (a server's: CERT_NONE until it
# asks for clients' certificates), loads the store into it and then verifies with it, while the
# importing thread is inside aiohttp's connector body (held there at _make_ssl_context).
OTHER_THREAD = """\
import json, ssl, sys, threading
from kiosk_agent.aiohttp_setup import skip_unverified_trust_store

inside, done, counted = threading.Event(), threading.Event(), []

def hold(frame, event, arg):
    if (event == "call" and frame.f_code.co_name == "_make_ssl_context"
            and not inside.is_set()):
        inside.set()
        done.wait(30)
    return None

def importer() -> None:
    sys.settrace(hold)
    import aiohttp.connector  # noqa: F401
    sys.settrace(None)

def other() -> None:
    inside.wait(30)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.set_default_verify_paths()
    context.verify_mode = ssl.CERT_REQUIRED
    counted.append(context.cert_store_stats()["x509_ca"])
    done.set()

assert skip_unverified_trust_store()
threads = [threading.Thread(target=importer), threading.Thread(target=other)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join(60)
after = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
after.set_default_verify_paths()
print(json.dumps({"inside": inside.is_set(), "during": counted,
                  "after": after.cert_store_stats()["x509_ca"]}))
"""


def test_another_threads_context_loads_the_store_while_aiohttp_is_imported(
    tmp_path: Path,
) -> None:
    """The stand-in is the importing thread's only: a context another thread makes while
    aiohttp's connector body runs (a server's that will ask for client certificates, made
    CERT_NONE first) gets the whole trust store, as it would have without the stand-in."""
    ca = _certificates(tmp_path)
    env = {**os.environ, "SSL_CERT_FILE": str(ca), "SSL_CERT_DIR": str(tmp_path / "none")}
    (seen,) = _run(OTHER_THREAD, env=env)
    assert seen == {"inside": True, "during": [1], "after": 1}


# aiohttp's connector body fails (here: the first import inside it, made to fail once)
IMPORT_FAILS = """\
import json, ssl, sys
from kiosk_agent.aiohttp_setup import skip_unverified_trust_store

assert skip_unverified_trust_store()
loader_fails = []
import importlib.machinery
run = importlib.machinery.SourceFileLoader.exec_module

def failing(self, module):
    if module.__name__ == "aiohttp.connector" and not loader_fails:
        loader_fails.append(1)
        raise OSError("a read error in the connector's file")
    return run(self, module)

importlib.machinery.SourceFileLoader.exec_module = failing
try:
    import aiohttp  # noqa: F401
except OSError as err:
    first = str(err)
importlib.machinery.SourceFileLoader.exec_module = run
for name in [n for n in sys.modules if n == "aiohttp" or n.startswith("aiohttp.")]:
    del sys.modules[name]
left = [type(f).__name__ for f in sys.meta_path
        if type(f).__module__ == "kiosk_agent.aiohttp_setup"]
put_back = "set_default_verify_paths" not in vars(ssl.SSLContext)
import aiohttp
from aiohttp import connector
print(json.dumps({"first": first, "finders_left": left, "method_put_back": put_back,
                  "again": skip_unverified_trust_store(),
                  "unverified": connector._SSL_CONTEXT_UNVERIFIED.cert_store_stats()["x509_ca"],
                  "verified": connector._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"],
                  "finders_at_end": [type(f).__name__ for f in sys.meta_path
                                     if type(f).__module__ == "kiosk_agent.aiohttp_setup"],
                  "loader_patched": "exec_module" in vars(connector.__spec__.loader)}))
"""


def test_a_connector_import_that_fails_leaves_no_finder_and_the_method_put_back(
    tmp_path: Path,
) -> None:
    """aiohttp's connector body raises (a read error, a broken install): the standard library's
    method is back, the finder gone (it stood first on sys.meta_path for the whole run, asked
    at every import), the loader its own; a second import is aiohttp's own, store and all."""
    ca = _certificates(tmp_path)
    env = {**os.environ, "SSL_CERT_FILE": str(ca), "SSL_CERT_DIR": str(tmp_path / "none")}
    (seen,) = _run(IMPORT_FAILS, env=env)
    assert seen == {
        "first": "a read error in the connector's file", "finders_left": [],
        "method_put_back": True, "again": False, "unverified": 1, "verified": 1,
        "finders_at_end": [], "loader_patched": False,
    }


# -- the verifying context's store: the hashed directory alone where it holds the bundle -------

# A process that sets the stand-in up, imports aiohttp, says how many certificates its verifying
# context holds parsed, and what its requests made of the test's two servers.
STORE_AND_REQUESTS = VERIFY_REQUESTS.replace(
    """        print(json.dumps({""",
    """        from aiohttp import connector
        print(json.dumps({
            "verified_parsed": connector._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"],""",
)


def _hash_link(directory: Path, certificate: Path, index: int = 0) -> Path:
    """``HASH.N`` in DIRECTORY, a link to CERTIFICATE, as ``openssl rehash`` makes them."""
    digest = subprocess.run(
        ["openssl", "x509", "-hash", "-noout", "-in", str(certificate)],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    link = directory / f"{digest}.{index}"
    link.symlink_to(certificate)
    return link


def _store(tmp_path: Path, *in_bundle: str) -> tuple[Path, dict[str, str]]:
    """The test's certificates, and a trust store of a bundle of IN_BUNDLE (file names) and a
    directory holding the CA's hashed link; the environment that makes them the system's."""
    _certificates(tmp_path)
    certs = tmp_path / "certs"
    certs.mkdir()
    bundle = certs / "bundle.crt"
    bundle.write_bytes(b"".join((tmp_path / name).read_bytes() for name in in_bundle))
    _hash_link(certs, tmp_path / "ca.crt")
    return certs, {**os.environ, "SSL_CERT_FILE": str(bundle), "SSL_CERT_DIR": str(certs)}


def test_where_the_directory_holds_the_bundle_no_certificate_is_parsed_and_requests_verify(
    tmp_path: Path,
) -> None:
    """The bundle's certificate is in the hashed directory too (Debian's layout, which
    update-ca-certificates makes): the verifying context takes the directory alone, parses
    nothing at the import (the 24-26 ms of a start the whole bundle cost here), and a request
    still takes the CA's server and refuses the one nobody signed."""
    certs, env = _store(tmp_path, "ca.crt")
    (seen,) = _run(STORE_AND_REQUESTS, str(tmp_path), env=env)
    assert seen["verified_parsed"] == 0
    assert seen["signed"] == "here"
    assert seen["self_signed"] == "refused: certificate"
    assert seen["self_signed_unverified"] == "here"
    # the MQTT client's context is the standard library's own, file and directory
    assert seen["mqtt_store_signed"] == "connected"
    assert seen["mqtt_store_self_signed"] == "refused: certificate"
    paths = ssl.DefaultVerifyPaths(str(certs / "bundle.crt"), str(certs), "", "", "", "")
    assert aiohttp_setup.bundle_directory(paths) == str(certs)


def test_a_certificate_only_the_bundle_holds_is_still_trusted(tmp_path: Path) -> None:
    """The bundle holds a certificate the directory lacks (here the server's that nobody
    signed, added to the file alone): the directory alone would refuse it, so the context
    loads both as before, and the request is taken."""
    _certs, env = _store(tmp_path, "ca.crt", "alone.crt")
    (seen,) = _run(STORE_AND_REQUESTS, str(tmp_path), env=env)
    assert seen["verified_parsed"] == 2
    assert seen["signed"] == "here"
    assert seen["self_signed"] == "here"


def test_what_does_not_show_the_directory_holds_the_bundle(tmp_path: Path) -> None:
    """A link OpenSSL's lookup does not reach (``HASH.1`` without ``HASH.0``), a PEM block
    other than a certificate in the bundle, a certificate cut short, a missing directory or
    bundle: the file and the directory both, as OpenSSL's defaults have them."""
    ca = _certificates(tmp_path)
    certs = tmp_path / "certs"
    certs.mkdir()
    bundle = certs / "bundle.crt"
    bundle.write_bytes(ca.read_bytes())

    def paths(cafile: Path | None = bundle, capath: Path | None = certs) -> object:
        return ssl.DefaultVerifyPaths(
            cafile and str(cafile), capath and str(capath), "", "", "", "")  # fmt: skip

    assert aiohttp_setup.bundle_directory(paths()) is None  # no link at all
    link = _hash_link(certs, ca, index=1)
    assert aiohttp_setup.bundle_directory(paths()) is None  # HASH.1 alone is not looked up
    link.rename(link.with_suffix(".0"))
    assert aiohttp_setup.bundle_directory(paths()) == str(certs)
    assert aiohttp_setup.bundle_directory(paths(cafile=None)) is None
    assert aiohttp_setup.bundle_directory(paths(capath=None)) is None
    assert aiohttp_setup.bundle_directory(paths(capath=tmp_path / "gone")) is None
    text = ca.read_bytes()
    trusted = text.replace(b"BEGIN CERTIFICATE", b"BEGIN TRUSTED CERTIFICATE").replace(
        b"END CERTIFICATE", b"END TRUSTED CERTIFICATE")  # fmt: skip
    bundle.write_bytes(text + trusted)
    assert aiohttp_setup.bundle_directory(paths()) is None
    bundle.write_bytes(text[: len(text) // 2])
    assert aiohttp_setup.bundle_directory(paths()) is None
    bundle.write_bytes(text.replace(b"\n", b"\r\n"))  # the same certificate, other line ends
    assert aiohttp_setup.bundle_directory(paths()) == str(certs)
