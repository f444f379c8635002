"""kiosk-agent: the on-device agent for vending machines and kiosks taking card payments."""

import os as _os

__version__ = "0.1.0"

# The package's modules are found from here on through the directory the process started with,
# its links resolved: an upgrade moves the release link (/opt/kiosk-agent/venv, docs/operations.md)
# under a running agent, and a module it imports on first use (a flow, a recovery, a person's
# resolution) must be this release's, not the next one's (tests/assembly/test_release_switch.py)
__path__[:] = [_os.path.realpath(p) for p in __path__]
