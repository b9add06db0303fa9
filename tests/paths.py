"""Where the tests find the published acceptance history: a verbatim copy kept in examples/.

The copy keeps the suite independent of where shared/ is laid; `test_audit_cli` checks that it
still equals the published one whenever shared/ is beside the checkout.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED_FIXTURE = ROOT / "examples" / "export-ledger.jsonl"
SEED_EXPECTED = ROOT / "examples" / "export-ledger.expected.json"
PUBLISHED = ROOT.parent / "shared" / "scenarios"
