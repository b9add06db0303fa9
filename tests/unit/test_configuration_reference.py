"""The documentation's one table of every flag and variable (`docs/reference/configuration.md`)
is the commands' own, and complete."""

from __future__ import annotations

import re

from detector.cli.reference import BEGIN, END, render, replace_in, settings_variables
from tests.paths import ROOT

PAGE = ROOT / "docs" / "reference" / "configuration.md"
# A variable named in the product's code: `SPLITBRAIN_X`, not a prefix such as `SPLITBRAIN_PAGE_`.
NAMED_IN_CODE = re.compile(r"\bSPLITBRAIN_[A-Z0-9_]*[A-Z0-9]\b")


def reference_block() -> str:
    text = PAGE.read_text(encoding="utf-8")
    return text[text.index(BEGIN) : text.index(END) + len(END)]


def test_the_table_is_the_one_the_commands_generate() -> None:
    assert reference_block() == render(), "the reference is stale: run `make reference`"


def test_every_variable_the_product_reads_is_in_the_table() -> None:
    table = reference_block()
    # detector/testing's variables pass a harness's state between its own processes (the
    # campaign's truth log and topic): no one configures the product with them.
    in_code = {
        name
        for path in (ROOT / "detector").rglob("*.py")
        if "testing" not in path.relative_to(ROOT).parts
        for name in NAMED_IN_CODE.findall(path.read_text(encoding="utf-8"))
    }
    missing = sorted(name for name in settings_variables() | in_code if f"`{name}`" not in table)
    assert not missing, f"not in the configuration reference: {missing}"


def test_every_flag_of_every_command_has_a_row() -> None:
    table = reference_block()
    for flag in ("--commit-interval-ms N", "--alertmanager-url URL", "--retention-h HOURS"):
        assert f"| `{flag}` |" in table
    assert "--sasl-password " not in table, "the refused secret flags are not offered"


def test_regenerating_keeps_the_rest_of_the_document() -> None:
    document = f"before\n{BEGIN}\nold rows\n{END}\nafter\n"
    assert replace_in(document) == f"before\n{render()}\nafter\n"
