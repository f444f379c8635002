"""A terminal program on the reader's port: the serial link keeps it out (TIOCEXCL).

``flock`` keeps a second agent out, but ``screen`` or ``minicom`` take no lock: they opened the
live port and could write into the reader's session. Played here with a real pty and a second
open from a child process that has dropped to an unprivileged user (``nobody``), as a tech's
login that is in the ``dialout`` group is: the pty is opened to everyone (mode 0666), so the
only thing that can refuse the child is the agent's hold on the port.
"""

from __future__ import annotations

import asyncio
import codecs
import errno
import fcntl
import importlib
import os
import termios
from collections.abc import Callable

import pytest

from kiosk_agent.platforms.serial import LinkState, SerialLink, SerialSettings
from kiosk_agent.platforms.serial_ports import port_holder

from ..helpers import until
from .vending_rig import LineDevice

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a child dropping to another user needs root (CI runs as root)"
)

NOBODY = 65534  # nobody, nogroup


async def _in_child(work: Callable[[], str], *, unprivileged: bool = True) -> str:
    """``work()``'s answer, run in a child process forked from this one that first drops to
    ``nobody`` (the interpreter cannot be exec'd anew by nobody: it lives under /root)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing of the parent's loop is touched here
        try:
            os.close(read_end)
            if unprivileged:
                # what the child may import later, imported while it still can: the
                # interpreter's own library is under /root, which nobody may not read
                codecs.lookup("ascii")
                # a link's open and stop run in the loop's thread pool: its module, loaded
                # here if the parent has not used one yet (the [program] case run first)
                importlib.import_module("concurrent.futures.thread")
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            answer = work()
        except BaseException as err:  # said to the parent, never raised here
            answer = f"child failed: {type(err).__name__}: {err}"
        os.write(write_end, answer.encode())
        os._exit(0)
    os.close(write_end)

    def collect() -> str:
        with os.fdopen(read_end, "rb") as answer:
            text = answer.read().decode()
        os.waitpid(pid, 0)
        return text

    return await asyncio.wait_for(asyncio.to_thread(collect), 30)


def _tech_types_into(port: str) -> Callable[[], str]:
    """A terminal program's open of the port, then what it would type into the session:
    ``opened``, or the refusal's errno by name."""

    def open_and_type() -> str:
        try:
            fd = os.open(port, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError as err:
            return errno.errorcode[err.errno]
        os.write(fd, b"C,0\n")
        os.close(fd)
        return "opened"

    return open_and_type


def _open_to_everyone(port: str) -> None:
    """The test's pty opened to every user: nothing but the link's hold can refuse a child."""
    os.chmod(port, 0o666)  # noqa: S103  # a pty of this test's own, gone with it


async def _open_as(port: str, user: str | None) -> str:
    return await _in_child(_tech_types_into(port), unprivileged=user is not None)


async def test_a_program_without_privileges_is_refused_the_readers_port_while_the_link_has_it(
) -> None:
    adapter = LineDevice()
    _open_to_everyone(adapter.port)
    lines: list[str] = []
    states: list[tuple[LinkState, str]] = []
    link = SerialLink("mdb:front", SerialSettings(port=adapter.port), lines.append,
                      on_state=lambda state, detail: states.append((state, detail)))
    try:
        # before the link takes it, anyone may open it (and write into it: the master hears it)
        assert await _open_as(adapter.port, "nobody") == "opened"
        await until(lambda: adapter.heard == ["C,0"])
        adapter.heard.clear()

        await link.start()
        await asyncio.wait_for(link.wait_connected(), 10)
        assert await _open_as(adapter.port, "nobody") == "EBUSY"  # what screen or minicom meet
        # what health's link says meanwhile: a tech refused knows why
        assert states[-1] == (LinkState.CONNECTED, f"{adapter.port}, held: other programs are "
                                                   "refused it; root is not")
        assert link.status()["held"] is True
        adapter.write(b"STATUS,IDLE\n")
        await until(lambda: lines == ["STATUS,IDLE"])
        assert adapter.heard == []  # nothing came into the session from the refused program
        assert link.write_line("C,1")
        await until(lambda: adapter.heard == ["C,1"])
        assert link.state is LinkState.CONNECTED
        assert link.stats.reconnects == 0

        # root is not refused: CAP_SYS_ADMIN passes TIOCEXCL (said in docs/operations.md)
        assert await _open_as(adapter.port, None) == "opened"
        await until(lambda: adapter.heard == ["C,1", "C,0"])

        # the link let go: the hold is cleared with it (a pty keeps it past a close otherwise)
        await link.stop()
        assert link.status()["held"] is False
        assert await _open_as(adapter.port, "nobody") == "opened"
    finally:
        await link.stop()
        adapter.close()


@pytest.mark.parametrize("holder", ["agent", "program"])
async def test_an_agent_under_another_user_is_refused_at_the_open_and_names_the_holder(
    holder: str,
) -> None:
    """A second agent run by a user without CAP_SYS_ADMIN (a tech's own login, the unit's
    service user) meets the hold before its flock: EBUSY is the port held, named (pid and
    command line: by the unit's flock, or, for a program that set TIOCEXCL with no flock, as
    the process that has the port open), and looked at again soon, as a flock held is."""
    adapter = LineDevice()
    _open_to_everyone(adapter.port)
    unit = SerialLink("mdb:front", SerialSettings(port=adapter.port), lambda line: None)
    held = -1

    def second_agent() -> str:
        async def run() -> str:
            link = SerialLink("mdb:front", SerialSettings(port=adapter.port), lambda line: None)
            await link.start()
            try:
                async with asyncio.timeout(10):
                    while link.stats.last_error == "":
                        await asyncio.sleep(0.01)
            finally:
                await link.stop()
            return link.stats.last_error

        return asyncio.run(run())  # the child's own loop (the parent's is not running there)

    try:
        if holder == "agent":
            await unit.start()
            await asyncio.wait_for(unit.wait_connected(), 10)
        else:
            held = os.open(adapter.port, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
            fcntl.ioctl(held, termios.TIOCEXCL)
        said = await _in_child(second_agent)
        if holder == "agent":  # /proc/locks is for everyone to read
            assert said.startswith(f"held by another process (pid {os.getpid()}: "), said
        else:  # root's descriptors are not for nobody to read: no one named, said so
            assert said.startswith("held by another process; "), said
            # a root agent may read them: it names the program
            named = await _in_child(lambda: port_holder(adapter.port), unprivileged=False)
            assert named.startswith(f"pid {os.getpid()}: "), named
        assert said.endswith("only one program may use a reader: stop that one first (looked "
                             "at again every 0.25 s)"), said
        assert adapter.heard == []
    finally:
        await unit.stop()
        if held >= 0:
            fcntl.ioctl(held, termios.TIOCNXCL)
            os.close(held)
        adapter.close()
