"""A failed connection in plain words (``network_words``): what `health`, `doctor` and the
service commands say when no answer came."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys

from kiosk_agent.service.errors import network_words


def test_a_failed_tls_handshake_is_named_as_such() -> None:
    err = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    assert network_words(err) == "the TLS handshake failed (is it https?)"


def test_refused_unresolved_and_silent_connections_are_told_apart() -> None:
    assert network_words(ConnectionRefusedError(111, "refused")) == (
        "nothing listens there (connection refused)")
    assert network_words(socket.gaierror(-2, "Name or service not known")) == (
        "no such host (the name does not resolve)")
    assert network_words(TimeoutError()) == "no answer in time"


def test_the_words_of_an_error_need_no_ssl_import() -> None:
    # a command that reads the journal imports this module and never connects: ssl's import
    # (some 10 ms of every start) waits for whatever makes a connection
    probe = ("import sys\nfrom kiosk_agent.service.errors import network_words\n"
             "words = network_words(ConnectionResetError(104, 'reset'))\n"
             "print('ssl' in sys.modules, words)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.strip() == "False connection reset by peer"
