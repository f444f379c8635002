"""Card brands for people: light to import (the journal's readers show them without the
service's models)."""

from __future__ import annotations

# card_brand_id: the interface numbers the networks 1..4 and leaves their names out; the project
# names them in the order the simulator deals its cards (docs/interface-choices.md, "Cards").
CARD_BRANDS = {1: "Visa", 2: "Mastercard", 3: "American Express", 4: "Discover"}


def card_brand_name(brand: int | str | None) -> str | None:
    """A card brand for people: ``2`` -> ``Mastercard``; an unknown code as ``card brand 7``;
    a name already given (``"Visa"``) as it is; None when there is none."""
    if brand is None or brand == "":
        return None
    text = str(brand).strip()
    if text.isdigit():
        return CARD_BRANDS.get(int(text), f"card brand {text}")
    return text
