"""Our lines about a host wrap at the terminal's width, as pyinfra prints them (its formatter's
4 spaces, then the host's styled prefix): at spaces only, a URL never broken."""

from __future__ import annotations

from pyinfra.api.host import Host
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State

from operations.runtime.host_lines import LOG_INDENT, host_block, host_text


def ct200() -> Host:
    """A host as a deploy has it: its state set up (pyinfra pads the prefix there)."""
    inventory = Inventory((["@fake/ct200"], {}))
    State(inventory)
    return inventory.get_host("@fake/ct200")


URL = "https://developer.download.nvidia.com/compute/cuda/redist/redistrib_12.8.1.json"


def test_a_long_line_wraps_under_its_text_and_keeps_urls_and_indents_whole() -> None:
    host = ct200()
    text = "model Qwen/Qwen3.6-27B: beside: 17 file(s) new or changed; " * 3 + URL
    said = host_text(host, text + "\n    a problem, indented as the refusal lists it", 80)
    lines = said.splitlines()
    assert lines[0].startswith(host.print_prefix)  # the formatter adds LOG_INDENT before it
    shown = [LOG_INDENT + lines[0].replace(host.print_prefix, "[@fake/ct200] "), *lines[1:]]
    assert all(len(line) <= 80 for line in shown if URL not in line), shown
    assert any(line.endswith(URL) for line in lines) and len(lines) > 3
    # Later lines sit under the text, the prefix's width in; an indented paragraph keeps its own.
    assert all(line.startswith(" " * len(shown[0].split("] ")[0] + "] ")) for line in shown[1:])
    assert lines[-1].strip() == "a problem, indented as the refusal lists it"
    assert lines[-1].startswith(LOG_INDENT + " " * len("[@fake/ct200] ") + "    ")
    assert " ".join(said.replace(host.print_prefix, "").split()) == " ".join(
        (text + " a problem, indented as the refusal lists it").split()
    )


def test_a_short_line_is_one_line() -> None:
    host = ct200()
    assert host_text(host, "deploy lock taken after 2s", 80) == (
        f"{host.print_prefix}deploy lock taken after 2s"
    )


def test_a_table_is_logged_under_its_host_as_it_is_and_fits_80_columns() -> None:
    """Issue 51: a table after the host's prefix on each line wrapped again (the prefix is 18
    columns for an address): under a title it keeps every line whole."""
    from operations.programs.canary_rows import TABLE_WIDTH, row, table

    host = ct200()
    long = "median of sglang@1.service, sglang@2.service, sglang@3.service: 1234.5 tok/s"
    lines = table([row("speed", long, "sglang@0.service: 1200.0 tok/s, x0.97", ">= 0.90", True)])
    said = host_block(host, "canary verdict:", lines).splitlines()
    assert said[0] == f"{host.print_prefix}canary verdict:"
    assert said[1:] == [LOG_INDENT + line for line in lines]
    assert len(LOG_INDENT) + TABLE_WIDTH == 80 and all(len(x) <= 80 for x in said[1:]), said
