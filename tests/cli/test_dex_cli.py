"""`kiosk-agent dex read | parse`: a real read over a pty, saved files, and clear refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kiosk_agent.audit import parse_audit
from kiosk_agent.audit.link_settings import LinkProtocol
from kiosk_agent.audit.virtual import VirtualDexPort
from kiosk_agent.cli import build_parser, command_word
from kiosk_agent.cli import contract as cli
from kiosk_agent.cli.dex import PROTOCOLS

DATA = Path(__file__).resolve().parents[1] / "data" / "dex"


async def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    parser = build_parser(command_word(argv))
    args = parser.parse_args(argv)
    cli.check_contract(args, parser)
    code = await args.handler(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_parse_prints_what_the_audit_states(capsys):
    code, out, _ = await run(capsys, ["dex", "parse", str(DATA / "jofemar.txt")])
    assert code == cli.EXIT_OK
    assert re.search(r"check +G85 F66D verified", out)
    assert re.search(
        r"paid vends +1435.00 in 423 since initialisation; 1424.50 in 421 since the "
        r"reset",
        out,
    )


async def test_parse_json_is_one_document_with_amounts_as_text(capsys):
    code, out, _ = await run(
        capsys, ["dex", "parse", str(DATA / "rheavendors-lucex2.eva_dts"), "--json"]
    )
    assert code == cli.EXIT_OK
    summary = json.loads(out)
    assert summary["paid_vends"]["value_since_init"] == "5865.30"
    assert summary["cashless"]["DA"]["count_since_init"] == 4156
    assert summary["notes"] == [
        "line 370, SE01: says 349 segments, the set has 369 (ST to SE); G85 vouches for the data"
    ]


REAL_FILES = sorted(path for path in DATA.iterdir() if path.suffix != ".md")


@pytest.mark.parametrize("path", REAL_FILES, ids=lambda path: path.name)
async def test_parse_json_reads_every_real_file_as_stored(capsys, path):
    """Each file exactly as a collector stored it (N&W's inside its telemetry wrapper)."""
    code, out, _ = await run(capsys, ["dex", "parse", str(path), "--json"])
    assert code == cli.EXIT_OK, out
    summary = json.loads(out)
    stated = re.search(rb"\nG85\*([0-9A-F]{4})", path.read_bytes())
    assert stated is not None
    assert summary["check"] == stated.group(1).decode()
    assert summary["products"] > 0
    assert summary["paid_vends"]["count_since_init"] > 0


async def test_parse_json_notes_the_wrapper_it_left_out(capsys):
    code, out, _ = await run(capsys, ["dex", "parse", str(DATA / "nw-concerto.daa"), "--json"])
    assert code == cli.EXIT_OK
    summary = json.loads(out)
    assert summary["sender"] == "NEC1190475"
    assert summary["paid_vends"]["count_since_reset"] == 49
    assert summary["notes"][:2] == [
        "85 bytes before DXS left out (a collector's wrapper or line noise)",
        "11 bytes after DXE left out (a collector's trailer)",
    ]


async def test_parse_csv_lists_the_columns_through_the_one_export(capsys):
    code, out, _ = await run(
        capsys, ["dex", "parse", str(DATA / "animo-optime.eva_dts"), "--format", "csv"]
    )
    assert code == cli.EXIT_OK
    lines = out.split("\r\n")
    assert lines[0].startswith("selection,name,price,paid_since_init")
    # its PA2 sends no value since the reset: not sent, left empty (never 0.00)
    assert lines[1] == "0,COFFEE,1.00,412,412.00,2655,,359,0"


async def test_a_file_that_is_no_audit_names_line_and_field_exit_2(capsys, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"DXS*X*VA*V0/6*1\r\nST*001*0001\r\nVA1*1x*2\r\nSE*3*0001\r\nDXE*1*1\r\n")
    code, out, err = await run(capsys, ["dex", "parse", str(bad), "--json"])
    assert code == cli.EXIT_USAGE
    assert json.loads(out)["error"].endswith(
        "line 3, VA101: not an amount: expected up to 15 digits, got '1x'"
    )
    assert err.startswith("error: ")
    code, _, err = await run(capsys, ["dex", "parse", str(tmp_path / "none.txt")])
    assert code == cli.EXIT_USAGE
    assert "cannot read" in err


async def test_read_from_a_port_given_and_save_what_was_read(capsys, tmp_path):
    audit = (DATA / "jofemar.txt").read_bytes()
    saved = tmp_path / "audit.txt"
    async with VirtualDexPort(audit) as port:
        code, out, _ = await run(
            capsys, ["dex", "read", "--port", port.port, "--json", "--save", str(saved)]
        )
    assert code == cli.EXIT_OK, out
    result = json.loads(out)
    assert result["link"]["machine_id"] == "VIRTUALVMC"
    assert result["paid_vends"]["count_since_init"] == 423
    assert saved.read_bytes() == audit
    assert parse_audit(saved.read_bytes()).check == "F66D"


async def test_read_in_ddcmp_from_a_port_given(capsys):
    audit = (DATA / "jofemar.txt").read_bytes()
    async with VirtualDexPort(audit, protocol=LinkProtocol.DDCMP) as port:
        code, out, _ = await run(
            capsys, ["dex", "read", "--port", port.port, "--protocol", "ddcmp", "--json"]
        )
    assert code == cli.EXIT_OK, out
    result = json.loads(out)
    assert result["link"]["machine_id"] == "VIRTUALVMC"
    assert result["link"]["protocol"] == "ddcmp"
    assert result["link"]["blocks"] == -(-len(audit) // 240)
    assert result["paid_vends"]["count_since_init"] == 423


def test_the_protocol_choices_are_the_links():
    assert [p.value for p in LinkProtocol] == PROTOCOLS


async def test_read_takes_the_port_from_the_config(capsys, tmp_path):
    audit = (DATA / "animo-optime.eva_dts").read_bytes()
    async with VirtualDexPort(audit) as port:
        config = tmp_path / "agent.yaml"
        config.write_text(
            "service: {simulator: {time_scale: 50}}\nterminals: [{device_id: SIM-0001}]\n"
            f"dex: {{port: {port.port}, deadline: 30}}\n"
        )
        code, out, _ = await run(capsys, ["dex", "read", "-c", str(config)])
    assert code == cli.EXIT_OK, out
    assert re.search(r"paid vends +8161.00 EUR in 8,161 since initialisation", out)
    assert "from VIRTUALVMC (dex_ucs)" in out


async def test_read_without_a_port_anywhere_is_a_usage_error(capsys, tmp_path):
    config = tmp_path / "agent.yaml"
    config.write_text(
        "service: {simulator: {time_scale: 50}}\nterminals: [{device_id: SIM-0001}]\n"
    )
    code, _, err = await run(capsys, ["dex", "read", "-c", str(config)])
    assert code == cli.EXIT_USAGE
    assert "has no dex: section; give --port" in err


async def test_read_of_the_demos_virtual_port_says_where_its_reads_are(capsys):
    demo = Path(__file__).resolve().parents[2] / "config" / "demo.yaml"
    code, _, err = await run(capsys, ["dex", "read", "-c", str(demo)])
    assert code == cli.EXIT_USAGE
    assert "virtual:snacks is the DEX port of the virtual machine the agent (or the demo)" in err
    assert f"`kiosk-agent audit -c {demo}` shows what the agent read" in err


async def test_a_read_that_fails_says_why_exit_1(capsys):
    code, out, _ = await run(capsys, ["dex", "read", "--port", "/dev/no-dex-here", "--json"])
    assert code == cli.EXIT_FAILED
    assert json.loads(out)["error"].startswith("no audit from /dev/no-dex-here: cannot open")
