"""aiohttp without the system's trust store in its TLS context that checks no certificate, and
with it read by name, not parsed whole, in the one that verifies (where that trusts the same).

Importing ``aiohttp.connector`` makes two TLS contexts: the one that verifies the server's
certificate (``ssl=True``, aiohttp's default and what every request of the program uses) and one
that verifies nothing (``ssl=False``, or a certificate's fingerprint, which aiohttp compares
itself: no request of the program asks for either). aiohttp loads the system's trust store into
both (``set_default_verify_paths``: every certificate of the CA bundle parsed, 144 here), 24-26 ms
of CPU each on the shared 2-core machine of 2026-11-30, some ten times that on a Pi Zero, at
every start, and the parsed certificates held for the whole run (0.8-0.9 MB of an idle agent's
RSS, bench/agent.py). A context whose ``verify_mode`` is ``CERT_NONE`` never reads that store, so
:func:`skip_unverified_trust_store` runs ``aiohttp.connector``'s body with
``SSLContext.set_default_verify_paths`` doing nothing for such a context, and puts the
standard library's own back as the body ends. The verifying context loads the store as before:
the service is reached over https, its first requests go before READY=1.

The verifying context's own store is the system's bundle file and its directory of hashed
certificate links (OpenSSL's default verify paths: what it trusts is the union of the two). On a
Debian-like system (Raspberry Pi OS: ``update-ca-certificates`` makes both from the same
certificates) the directory holds every certificate of the file, so the file adds nothing to
what the context trusts, and parsing it whole is the 24-26 ms above. :func:`bundle_directory`
proves that (every certificate of the file, compared as text, is one a hashed link the lookup
reaches holds: 2 ms here, no certificate parsed) and the context then takes the directory alone,
which OpenSSL reads by the issuer's name at a handshake: the one or two certificates a
connection needs, not the 144 of the bundle. Where the proof fails (a bundle with a certificate
the directory lacks, no directory, ``SSL_CERT_FILE`` naming another file, a read error) the
context loads both as before.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from importlib.machinery import ModuleSpec, PathFinder
from typing import Any

CONNECTOR = "aiohttp.connector"
_PATHS = "set_default_verify_paths"


def skip_unverified_trust_store() -> bool:
    """Make aiohttp's context that verifies nothing without the trust store, when aiohttp's
    connector is first imported; whether it will (not if it is imported already). Nothing is
    imported here: a command that never makes a request loads neither aiohttp nor ssl."""
    if CONNECTOR in sys.modules:
        return False
    if not any(isinstance(finder, _ConnectorFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ConnectorFinder())
    return True


class _ConnectorFinder:
    """Finds ``aiohttp.connector`` (and nothing else) as aiohttp has it, and runs its body with
    the trust store left out of a context that verifies nothing; gone from ``sys.meta_path``
    as the body starts (a body that raises too: a second import is aiohttp's own)."""

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: object = None
    ) -> ModuleSpec | None:
        if name != CONNECTOR:
            return None
        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run_body: Callable[[types.ModuleType], None] = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            # once, whether the body ran or raised: a finder left behind would be asked at
            # every import of the run, and the loader (a zip's is shared) would wrap others
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            vars(loader).pop("exec_module", None)
            with _no_trust_store_where_nothing_is_verified():
                run_body(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_BEGIN = b"-----BEGIN "
_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
_END = b"-----END CERTIFICATE-----"


def bundle_directory(paths: Any) -> str | None:
    """``paths.capath`` (``ssl.get_default_verify_paths()``'s) when the hashed links in it hold
    every certificate of the bundle file ``paths.cafile``, so that the directory alone trusts
    what the two together do; None where that is not shown. Only text is compared: the
    certificates' bodies between their PEM markers, whitespace left out; a bundle holding any
    other PEM block (trusted certificates with OpenSSL's trust settings, CRLs) is not taken. A
    link counts where OpenSSL's lookup reaches it: ``HASH.N`` with ``HASH.0`` .. ``HASH.N-1``
    there too (it stops at the first missing one)."""
    cafile, capath = paths.cafile, paths.capath
    if not cafile or not capath:
        return None
    try:
        with open(cafile, "rb") as bundle_file:
            bundle = bundle_file.read()
        if bundle.count(_BEGIN) != bundle.count(_CERTIFICATE):
            return None
        wanted = _certificates(bundle)
        names = set(os.listdir(capath))
        held: set[bytes] = set()
        for name in names:
            stem, dot, index = name.partition(".")
            if not (dot and _is_hash(stem) and index.isdigit() and index.isascii()):
                continue
            if any(f"{stem}.{lower}" not in names for lower in range(int(index))):
                continue
            with open(os.path.join(capath, name), "rb") as linked:
                held |= _certificates(linked.read())
    except (OSError, ValueError):
        return None
    return str(capath) if wanted <= held else None


def _is_hash(stem: str) -> bool:
    return len(stem) == 8 and all(c in "0123456789abcdef" for c in stem)


def _certificates(pem: bytes) -> set[bytes]:
    """Each certificate's body in a PEM text, whitespace left out."""
    found = set()
    start = pem.find(_CERTIFICATE)
    while start >= 0:
        end = pem.find(_END, start)
        if end < 0:
            raise ValueError("a certificate without its end")
        found.add(b"".join(pem[start + len(_CERTIFICATE) : end].split()))
        start = pem.find(_CERTIFICATE, end)
    return found


@contextlib.contextmanager
def _no_trust_store_where_nothing_is_verified() -> Iterator[None]:
    """``ssl.SSLContext.set_default_verify_paths`` a no-op for a context of ``CERT_NONE`` inside
    the block, in the thread that runs it only; the class's own method (the standard library's)
    again after it. The class is the process's: a context another thread makes meanwhile (one
    that verifies nothing yet, as a server's is made before it asks for client certificates)
    gets the store as it would without the block."""
    try:
        import ssl
    except ImportError:  # a Python without ssl: aiohttp makes no context either
        yield
        return

    own = vars(ssl.SSLContext).get(_PATHS)  # None: inherited from _ssl._SSLContext
    load: Callable[[Any], None] = ssl.SSLContext.set_default_verify_paths
    importer = _thread.get_ident()

    def where_verified(context: Any) -> None:
        if _thread.get_ident() != importer:
            load(context)
        elif context.verify_mode != ssl.CERT_NONE:
            directory = bundle_directory(ssl.get_default_verify_paths())
            if directory is None:
                load(context)
            else:  # the same certificates trusted, read by name at a handshake
                context.load_verify_locations(capath=directory)

    setattr(ssl.SSLContext, _PATHS, where_verified)
    try:
        yield
    finally:
        if own is None:
            delattr(ssl.SSLContext, _PATHS)
        else:
            setattr(ssl.SSLContext, _PATHS, own)
