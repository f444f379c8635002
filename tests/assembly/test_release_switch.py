"""An upgrade switches the release link under a running agent (docs/operations.md: install
beside, ``ln -sfn``, restart): a module the old process imports after the switch (a flow named
by its first sale, a recovery, a person's resolution: imported on first use since the idle
memory's tenth round) must come from the release the process started with, not the new one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import kiosk_agent

_CHILD = """
import os, sys
from pathlib import Path
import kiosk_agent.sales.recovery  # what every run imports
assert Path(kiosk_agent.__file__).is_relative_to(sys.argv[1]), kiosk_agent.__file__
link, new = Path(sys.argv[1]), Path(sys.argv[2])
tmp = link.with_name("venv.tmp")
tmp.symlink_to(new)
os.replace(tmp, link)  # ln -sfn: the link moves at once
from kiosk_agent.sales import recover_sale
from kiosk_agent.sales import enroll
print(getattr(recover_sale, "RELEASE", "old"), getattr(enroll, "RELEASE", "old"))
"""


def test_a_module_first_imported_after_the_release_link_moved_is_the_old_releases(
    tmp_path: Path,
) -> None:
    package = Path(kiosk_agent.__file__).parent
    old, new = tmp_path / "venv-old", tmp_path / "venv-new"
    for release in (old, new):
        shutil.copytree(package, release / "kiosk_agent",
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("recover_sale.py", "enroll.py"):
        with (new / "kiosk_agent" / "sales" / name).open("a") as module:
            module.write('\nRELEASE = "new"\n')
    link = tmp_path / "venv"
    link.symlink_to(old)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(link), str(new)],
        env={**os.environ, "PYTHONPATH": str(link), "PYTHONDONTWRITEBYTECODE": "1"},
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["old", "old"]
