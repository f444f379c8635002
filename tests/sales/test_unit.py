"""The unit's identity and whose money is its own: order ids carry the unit id, a journal found
on another machine takes no customer until adopted, another unit's charges are never moved."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kiosk_agent.sales import unit
from kiosk_agent.sales.machine import Machine, this_machine
from kiosk_agent.sales.unit import OwnUnit, make_order_id, split_order_id, unit_of


def a_machine(root: Path, machine_id: str, serial: str = "", mac: str = "") -> Path:
    """A made-up machine under ``root`` (what KIOSK_MACHINE_ROOT points at)."""
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "machine-id").write_text(machine_id + "\n")
    if serial:
        (root / "proc").mkdir(exist_ok=True)
        (root / "proc" / "cpuinfo").write_text(
            f"processor\t: 0\nHardware\t: BCM2835\nSerial\t\t: {serial}\nModel\t: Pi\n"
        )
    if mac:
        interface = root / "sys" / "class" / "net" / "eth0"
        (interface / "device").mkdir(parents=True)
        (interface / "address").write_text(mac + "\n")
        virtual = root / "sys" / "class" / "net" / "docker0"  # no device: not hardware
        virtual.mkdir()
        (virtual / "address").write_text("02:42:00:00:00:01\n")
    return root


def test_the_machine_is_its_machine_id_and_its_hardware_serial_or_mac(tmp_path: Path) -> None:
    pi = this_machine(a_machine(tmp_path / "pi", "a" * 32, serial="10000000abcdef01"))
    assert pi == Machine("a" * 32, "serial:10000000abcdef01")
    pc = this_machine(a_machine(tmp_path / "pc", "b" * 32, mac="DC:A6:32:01:02:03"))
    assert pc == Machine("b" * 32, "mac:dc:a6:32:01:02:03")  # the physical one, not docker0
    assert this_machine(tmp_path / "nothing") == Machine()
    # a cloned card: the same machine-id, another board
    clone = this_machine(a_machine(tmp_path / "clone", "a" * 32, serial="10000000ffff0002"))
    assert "serial:10000000abcdef01, here serial:10000000ffff0002" in pi.differs(clone)
    assert pi.differs(pi) == ""
    assert Machine.from_text(pi.to_text()) == pi
    assert Machine.from_text("not json") == Machine()


def test_the_machine_root_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIOSK_MACHINE_ROOT", str(a_machine(tmp_path, "c" * 32)))
    assert this_machine().machine_id == "c" * 32


def test_an_order_id_says_whose_it_is_by_itself() -> None:
    own = OwnUnit("3F9C0E12AB")
    order = make_order_id(own.id, "9f3c0a77d21b4e55aa")
    assert order == "KA3F9C0E12AB-9F3C0A77D21B4E55"
    assert len(order + "-held") <= 64  # the order_id field's bound
    assert unit_of(order) == unit_of(order + "-2") == unit_of(order + "-held") == own.id
    assert split_order_id(order + "-3") == (order, "3")
    assert split_order_id("KA0123456789ABCDEF01-2") == ("KA0123456789ABCDEF01", "2")
    assert split_order_id("POS-0042") is None
    assert own.made_here(order)
    assert own.made_here(order + "-2")
    other = make_order_id("0000000001", "9f3c0a77d21b4e55aa")
    assert not own.made_here(other)
    assert not own.owns_sale(other)
    # the older form is owned by the journal holding it, while the unit keeps its first id
    assert not own.made_here("KA0123456789ABCDEF01")
    assert own.owns_sale("KA0123456789ABCDEF01")
    assert not OwnUnit("3F9C0E12AB", legacy=False).owns_sale("KA0123456789ABCDEF01")
    # a unit found on another machine owns nothing
    clone = OwnUnit("3F9C0E12AB", mismatch="machine-id differs")
    assert not clone.made_here(order)
    assert not clone.owns_sale(order)
    assert "kiosk-agent unit adopt" in clone.refusal()


def test_the_id_survives_reopening_and_a_journal_begun_anew(tmp_path: Path) -> None:
    here = Machine("a" * 32, "serial:1")
    path = tmp_path / "journal.db"
    with sqlite3.connect(path) as db:
        first = unit.load(db, path, here)
        assert unit.load(db, path, here).id == first.id  # a restart, an upgrade
    assert first.confirmed
    assert first.legacy
    path.unlink()  # lost: the copy beside it keeps the id
    with sqlite3.connect(path) as db:
        again = unit.load(db, path, here)
    assert again.id == first.id
    assert again.confirmed


def test_a_journal_on_another_machine_is_not_confirmed_until_adopted_under_a_new_id(
    tmp_path: Path,
) -> None:
    made = Machine("a" * 32, "serial:1")
    clone = Machine("a" * 32, "serial:2")  # the SD card's image on another board
    path = tmp_path / "journal.db"
    with sqlite3.connect(path) as db:
        original = unit.load(db, path, made)
        found = unit.load(db, path, clone)
        assert found.id == original.id
        assert not found.confirmed
        assert "serial:1, here serial:2" in found.mismatch
        former, fresh = unit.adopt(db, path, clone)
        adopted = unit.load(db, path, clone)
    assert former.unit_id == original.id
    assert adopted.confirmed
    assert adopted.id == fresh.unit_id != original.id
    assert not adopted.legacy  # the older form's sales were the original unit's
    assert original.id in fresh.why
    # the original's money is not the adopted unit's to move
    assert not adopted.owns_sale(make_order_id(original.id, "ab" * 8))


def test_the_previous_release_reads_past_the_unit_table(tmp_path: Path) -> None:
    """The identity is a table of its own: the sales table is untouched."""
    from kiosk_agent.sales.journal import Journal

    journal = Journal(tmp_path / "journal.db")
    journal.open()
    unit.load(journal.db, journal.path, Machine("a" * 32))
    columns = [r[1] for r in journal.db.execute("PRAGMA table_info(sales)")]
    journal.close()
    assert "unit_id" not in columns
