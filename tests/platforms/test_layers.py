"""Platforms report facts and the sale decides: from ``sales`` a platform imports the
dispenser's types (``sales.model``: the request, the outcome, the refusals, the sale's clock)
and nothing else, so no money rule or sale timer can live on the platforms' side."""

from __future__ import annotations

from pathlib import Path

import kiosk_agent.platforms
from tests.sales.test_layers import imports_of

PLATFORMS = Path(kiosk_agent.platforms.__file__).parent
THE_DISPENSERS_TYPES = {"kiosk_agent.sales.model"}


def test_platforms_import_nothing_from_sales_but_the_dispensers_types() -> None:
    offenders = {
        f"{path.name}: {name}"
        for path in PLATFORMS.glob("*.py")
        for name in imports_of(path)
        if name.startswith("kiosk_agent.sales") and name not in THE_DISPENSERS_TYPES
    }
    assert not offenders, sorted(offenders)
    assert len(list(PLATFORMS.glob("*.py"))) > 5  # the package is really there
