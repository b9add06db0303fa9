#!/usr/bin/env python3
"""Draw docs/findings-view.png from a real run of `splitbrain ui`.

A local broker (detector.devstack.kafka), the findings the engine finds in every history of
examples/ published to a findings topic, the view started on it, and Debian's headless chromium
(through chromium-driver) opening the acceptance history's finding. Everything started is
stopped at the end.

python scripts/screenshot_view.py [--out docs/findings-view.png]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from detector.contracts.findings import Finding
from detector.contracts.topics import FINDINGS_TOPIC
from detector.devstack.kafka import LocalKafka
from detector.devstack.worker import connection_env
from detector.histories.audit import audit_lines
from detector.testing.view import chromium, publish, running_view
from detector.view.pages import finding_path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
ACCEPTANCE = EXAMPLES / "export-ledger.jsonl"


def findings_of(history: Path) -> list[Finding]:
    with history.open("rb") as lines:
        return list(audit_lines(lines).findings.values())


def publish_examples(kafka: dict[str, Any]) -> None:
    """The findings of every history of examples/, on a fresh findings topic."""
    admin = AdminClient(kafka)
    admin.create_topics([NewTopic(FINDINGS_TOPIC, 3, 1)])[FINDINGS_TOPIC].result(30)
    histories = sorted(p for p in EXAMPLES.iterdir() if p.suffix in (".jsonl", ".log"))
    publish(kafka, FINDINGS_TOPIC, [f for h in histories for f in findings_of(h)])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "findings-view.png")
    args = parser.parse_args(argv)
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser is None or driver is None:
        print("needs Debian's chromium and chromium-driver packages", file=sys.stderr)
        return 2
    (acceptance,) = findings_of(ACCEPTANCE)
    with tempfile.TemporaryDirectory(prefix="splitbrain-view-") as tmp:
        work = Path(tmp)
        broker = LocalKafka(work / "kafka")
        broker.start()
        try:
            publish_examples(broker.client_config())
            env = connection_env(broker.client_config())
            with (
                running_view(env, work / "view.log") as url,
                chromium(browser, driver, work / "profile") as page,
            ):
                page.set_window_size(1400, 1150)
                page.get(url.rstrip("/") + finding_path(acceptance.finding_id))
                page.save_screenshot(str(args.out))
        finally:
            broker.stop()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
