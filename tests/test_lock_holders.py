"""Who holds a port or a lock, named from /proc: another program's words, made safe to show."""

from __future__ import annotations

import asyncio
import sys

from kiosk_agent.lock_holders import listeners

_LISTENS = "import socket, sys\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\n" \
           "print(s.getsockname()[1], flush=True)\nsys.stdin.read()"


async def test_a_holders_command_line_is_named_without_its_control_characters() -> None:
    """A holder's arguments are its own: a line break or an escape in them went into the log
    line and health that name it, as written (a line of its own in the log, an escape on a
    tech's terminal). Now each is a space; the words stay."""
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _LISTENS, "fake\nERROR a log line of its own", "\x1b[2Jwiped",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        port = int(await asyncio.wait_for(holder.stdout.readline(), 30))
        [named] = listeners(port)
        assert named.startswith(f"pid {holder.pid}: ")
        assert named.isprintable(), repr(named)
        assert named.endswith("fake ERROR a log line of its own  [2Jwiped")
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        await asyncio.wait_for(holder.wait(), 30)
