"""Where the tests find the acceptance history: `examples/`, in the repository, as every user
of a clone or a wheel has it."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED_FIXTURE = ROOT / "examples" / "export-ledger.jsonl"
SEED_EXPECTED = ROOT / "examples" / "export-ledger.expected.json"
