"""The documentation cannot drift from the code, and the README stands alone.

Every shell and Python block of the README and of `docs/` (the languages of `tests.docs.CHECKED`)
either runs here or says on the line before it why it cannot (`<!-- not-run: <reason> -->`: a
server, a broker, a demo, a fragment of the reader's program). What runs:

- a `console` block, command by command (`$ ` lines; the lines after one are what it prints),
  its shown output compared with what the command prints, stdout and stderr together;
- a `sh`/`shell`/`bash` block as one script that must succeed;
- a `python` block as a program that must succeed; when the next block is preceded by
  `<!-- output -->`, what it prints must be that block.

They run from a scratch directory holding `examples/` (the repository's), with `splitbrain` (and
`.venv/bin/splitbrain`, as a checkout's README writes it) being this checkout's command, and no
`SPLITBRAIN_*` variable of the machine's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from detector.adapters._sink import _Metrics as AdapterMetrics
from detector.cli.audit import Expectation, ExpectedFinding
from detector.contracts.findings import ConditionKind, Severity
from detector.contracts.page_state import SinkName
from detector.errors import ExitCode
from detector.leases.gauges import LeaseGauges
from detector.paging.metrics import PageMetrics
from detector.telemetry.metrics import WorkerMetrics
from detector.view.metrics import ViewMetrics
from detector.view.store import FindingsStore
from tests import docs
from tests.paths import ROOT

SCRATCH_TIMEOUT_S = 120
# The README's front door: what the issue asked it to hold, at most.
README_MAX_LINES = 200


def checked_blocks() -> list[docs.Block]:
    return [
        block
        for page in docs.pages()
        for block in docs.blocks(page)
        if block.language in docs.CHECKED
    ]


def runnable() -> list[docs.Block]:
    return [block for block in checked_blocks() if block.not_run is None]


def environment(scratch: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("SPLITBRAIN_")}
    env["PATH"] = f"{scratch / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    env["COLUMNS"] = "100"  # argparse's help wraps at the terminal's width
    env["NO_COLOR"] = "1"
    return env


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A working directory as a reader's: the examples, and `splitbrain` on PATH."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    command = tmp_path / ".venv" / "bin" / "splitbrain"
    command.parent.mkdir(parents=True)
    command.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m detector.cli "$@"\n')
    command.chmod(0o755)
    (command.parent / "python").symlink_to(sys.executable)
    return tmp_path


def run(
    program: list[str], scratch: Path, *, merged: bool = False
) -> subprocess.CompletedProcess[str]:
    """`program` in the scratch directory; `merged`: stderr into stdout, as on a terminal."""
    return subprocess.run(
        program,
        cwd=scratch,
        env=environment(scratch),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merged else subprocess.PIPE,
        text=True,
        timeout=SCRATCH_TIMEOUT_S,
        check=False,
    )


def console_steps(text: str) -> list[tuple[str, str]]:
    """(command, shown output) per `$ ` line of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            assert steps, f"output before any command: {line!r}"
            steps[-1][1].append(line)
    return [(command, "\n".join(shown).rstrip()) for command, shown in steps]


def shown_output(block: docs.Block) -> str | None:
    """The block after `block` when it is marked as its output."""
    following = [b for b in docs.blocks(block.path) if b.line > block.line]
    if following and following[0].before.strip() == docs.OUTPUT:
        return following[0].text
    return None


@pytest.mark.parametrize("block", runnable(), ids=lambda block: block.where)
def test_a_documented_block_runs_as_shown(block: docs.Block, scratch: Path) -> None:
    if block.language == "console":
        for command, shown in console_steps(block.text):
            done = run(["bash", "-c", command], scratch, merged=True)
            printed = "\n".join(line.rstrip() for line in done.stdout.splitlines())
            assert printed.rstrip() == shown, f"{block.where}: `{command}` printed otherwise"
    elif block.language == "python":
        done = run([sys.executable, "-c", block.text], scratch)
        assert done.returncode == 0, f"{block.where}:\n{done.stderr}"
        output = shown_output(block)
        if output is not None:
            assert done.stdout == output, f"{block.where}: printed otherwise"
    else:
        done = run(["bash", "-c", "set -euo pipefail\n" + block.text], scratch, merged=True)
        assert done.returncode == 0, f"{block.where}:\n{done.stdout}"


def test_every_shell_and_python_block_runs_or_says_why_not() -> None:
    blocks = checked_blocks()
    assert len(blocks) > 30, "the pages' blocks were not found"
    unexplained = [block.where for block in blocks if block.not_run == ""]
    assert unexplained == [], "a not-run block needs its reason"
    consoles = [block for block in runnable() if block.language == "console"]
    assert all(console_steps(block.text) for block in consoles)
    # What the issue found drifting: the version the README showed.
    versions = [block for block in consoles if "$ splitbrain --version" in block.text]
    assert versions, "the documented `splitbrain --version` is run"


def test_a_console_block_is_compared_line_by_line() -> None:
    steps = console_steps("$ splitbrain --version\nsplitbrain-detector 0.1.0\n$ true\n")
    assert steps == [("splitbrain --version", "splitbrain-detector 0.1.0"), ("true", "")]


def test_a_marker_needs_a_reason(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- not-run: needs a broker -->\n```sh\nsplitbrain worker\n```\n\n"
        "<!-- not-run: -->\n```python\nimport x\n```\n\n```console\n$ true\n```\n"
    )
    found = docs.blocks(page)
    assert [(b.language, b.not_run) for b in found] == [
        ("sh", "needs a broker"),
        ("python", ""),
        ("console", None),
    ]


# ---- the README: the front door, short, and every link resolves --------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_the_readme_is_a_front_door() -> None:
    lines = docs.README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES


def test_every_relative_link_of_the_readme_resolves() -> None:
    text = docs.README.read_text(encoding="utf-8")
    targets = [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]
    assert len(targets) >= 10, "the README links into the site"
    broken = []
    for target in targets:
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else docs.README
        resolves = file.exists() and (
            not anchor or (file.suffix == ".md" and anchor in docs.anchors(file))
        )
        if not resolves:
            broken.append(target)
    assert broken == []


# ---- the contracts: every field of each schema is documented on its page ---------------------

CONTRACT_PAGES = {
    "ownership-event.v1.schema.json": "events.md",
    "finding.v1.schema.json": "findings.md",
    "page-state.v1.schema.json": "page-state.md",
}


@pytest.mark.parametrize("schema", sorted(CONTRACT_PAGES))
def test_every_field_of_a_contract_is_named_on_its_page(schema: str) -> None:
    fields = json.loads((ROOT / "topics" / "schemas" / schema).read_text())["properties"]
    page = docs.DOCS / "reference" / "contracts" / CONTRACT_PAGES[schema]
    text = page.read_text(encoding="utf-8")
    assert [name for name in fields if f"`{name}`" not in text] == []


def test_the_findings_page_has_a_row_per_field_and_no_other() -> None:
    fields = set(
        json.loads((ROOT / "topics" / "schemas" / "finding.v1.schema.json").read_text())[
            "properties"
        ]
    )
    text = (docs.DOCS / "reference" / "contracts" / "findings.md").read_text(encoding="utf-8")
    table = text[text.index("| field | present | meaning |") :]
    rows = {
        name
        for line in table.splitlines()
        if line.startswith("| `")
        for name in re.findall(r"`(\w+)`", line.split("|")[1])
    }
    assert rows == fields


def test_the_acceptance_history_is_documented_as_it_is() -> None:
    """The expectation shown on its contract page is the file in examples/."""
    page = docs.DOCS / "reference" / "contracts" / "audit-expect.md"
    shown = [block for block in docs.blocks(page) if block.language == "json"]
    expected = ROOT / "examples" / "export-ledger.expected.json"
    assert [json.loads(block.text) for block in shown] == [json.loads(expected.read_text())]


def test_the_lease_store_page_shows_the_worker_its_test_runs() -> None:
    """The page's worker is examples/lease_worker.py included whole (pymdownx.snippets), the
    program tests/integration/test_lease_worker_example.py runs, so the two cannot drift."""
    page = docs.DOCS / "lease-store" / "index.md"
    shown = [block.text for block in docs.blocks(page) if block.language == "python"]
    assert shown == ['--8<-- "examples/lease_worker.py"\n']


def test_the_expectation_format_is_the_one_audit_reads() -> None:
    text = (docs.DOCS / "reference" / "contracts" / "audit-expect.md").read_text(encoding="utf-8")
    keys = [*Expectation.__annotations__, *ExpectedFinding.__annotations__]
    assert [key for key in keys if f"| `{key}` |" not in text] == []


def test_the_exit_codes_page_lists_every_exit_code() -> None:
    text = (docs.DOCS / "reference" / "contracts" / "exit-codes.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", text, re.M)
    assert rows == [(str(code.value), code.name) for code in ExitCode]


# ---- the metrics: every family a process exports is on the metrics page ----------------------


def exported_families() -> set[str]:
    """The exposition names of what the worker, the pager bridge, the findings view, the relay and
    the adapters export (a counter `x` is `x_total` on /metrics)."""
    registries = [
        WorkerMetrics(CollectorRegistry()).registry,
        PageMetrics(list(SinkName), CollectorRegistry()).registry,
        ViewMetrics(FindingsStore()).registry,
        LeaseGauges(CollectorRegistry()).registry,
    ]
    adapters = CollectorRegistry()
    AdapterMetrics(adapters)
    return {
        family.name + ("_total" if family.type == "counter" else "")
        for registry in [*registries, adapters]
        for family in registry.collect()
    }


def test_every_exported_metric_is_on_the_metrics_page() -> None:
    text = (docs.DOCS / "reference" / "metrics.md").read_text(encoding="utf-8")
    families = exported_families()
    assert len(families) > 40
    named = {name for name in families if f"`{name}`" in text}
    # The relay's gauges have their table on its page; the metrics page names their prefix.
    relay = (docs.DOCS / "lease-store" / "relay.md").read_text(encoding="utf-8")
    on_relay_page = {name for name in families if name.startswith("splitbrain_lease_store_")}
    assert "`splitbrain_lease_store_…`" in text
    assert sorted(name for name in on_relay_page if f"`{name}`" not in relay) == []
    assert sorted(families - named - on_relay_page) == []


def test_every_topic_of_the_topics_file_has_a_row() -> None:
    topics = yaml.safe_load((ROOT / "topics" / "topics.yaml").read_text())["topics"]
    text = (docs.DOCS / "reference" / "contracts" / "topics.md").read_text(encoding="utf-8")
    assert len(topics) >= 4
    assert [name for name in topics if f"| `{name}` |" not in text] == []


def test_every_condition_has_a_row_with_its_severity() -> None:
    text = (docs.DOCS / "reference" / "rules.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| .* \| ([a-z /]+) \|$", text, re.M))
    assert set(rows) == {kind.value for kind in ConditionKind}
    assert all(set(rows[kind].split(" / ")) <= set(Severity) for kind in rows)
