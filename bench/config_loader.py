"""Config loader benchmark: the attacks of issue 10 and the largest file the loader accepts.

    python bench/config_loader.py [--dir DIR]

Each case is run through ``check_config`` in this process, with the peak of Python memory
allocations (tracemalloc) and the wall time:

- a 458-byte "billion laughs" alias bomb (9**9 values once expanded): refused, milliseconds;
- a 5.6 MB file: refused from its size before it is read (before: 27 s and 589 MB);
- a chain of includes that form a cycle: named, no RecursionError;
- a valid config just under the per-file cap (256 KiB of terminals): the cost of the cap;
- the demo config: the everyday figure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path

from kiosk_agent.config.load import check_config
from kiosk_agent.config.yaml_loader import MAX_FILE_BYTES

HEAD = "service:\n  simulator: {}\nterminals:\n"
LINE = "  - {device_id: SIM-0001, name: front-counter-reader}\n"
BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{name}: &{name} [{','.join(['*' + prev] * 9)}]\n"
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
)


def measure(path: Path) -> tuple[float, float, int]:
    """Seconds (best of 3), peak MB of allocations (a separate traced run), mistakes found."""
    seconds = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        errors = check_config(path)
        seconds = min(seconds, time.perf_counter() - started)
    tracemalloc.start()
    check_config(path)
    peak = tracemalloc.get_traced_memory()[1] / 1e6
    tracemalloc.stop()
    return seconds, peak, len(errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    directory = Path(args.dir or tempfile.mkdtemp(prefix="bench-config-"))
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "alias_bomb": BOMB + HEAD + "  - {device_id: SIM-0001}\n",
        "huge_5_6mb": HEAD + LINE * (5_600_000 // len(LINE)),
        "include_cycle": HEAD + LINE + "journal: !include a.yaml\n",
        "at_cap": HEAD + LINE * ((MAX_FILE_BYTES - len(HEAD)) // len(LINE)),
    }
    (directory / "a.yaml").write_text("x: !include b.yaml\n")
    (directory / "b.yaml").write_text("y: !include a.yaml\n")
    for name, text in files.items():
        (directory / f"{name}.yaml").write_text(text)
    demo = Path(__file__).resolve().parents[1] / "config" / "demo.yaml"
    shutil.copyfile(demo, directory / "demo.yaml")

    check_config(directory / "demo.yaml")  # imports the platforms once, outside the figures
    result: dict[str, float | int] = {}
    print(f"{'case':<14} {'bytes':>10} {'seconds':>9} {'peak MB':>8} {'mistakes':>8}")
    for name in [*files, "demo"]:
        path = directory / f"{name}.yaml"
        seconds, peak, mistakes = measure(path)
        print(f"{name:<14} {path.stat().st_size:>10,} {seconds:>9.3f} {peak:>8.1f} {mistakes:>8}")
        result[f"{name}_bytes"] = path.stat().st_size
        result[f"{name}_s"] = round(seconds, 4)
        result[f"{name}_peak_mb"] = round(peak, 1)
        result[f"{name}_mistakes"] = mistakes
    if args.dir is None:
        shutil.rmtree(directory)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
