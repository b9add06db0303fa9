"""The committed JSON Schemas are what other teams validate against: they must match the models."""

from pathlib import Path

import pytest

from detector.contracts.schemas import SCHEMAS, render

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "topics" / "schemas"


@pytest.mark.parametrize("filename", sorted(SCHEMAS))
def test_committed_schema_matches_the_model(filename: str) -> None:
    committed = (SCHEMA_DIR / filename).read_text(encoding="utf-8")
    assert committed == render(filename), (
        f"topics/schemas/{filename} drifted from the model: run `make schemas` and review the diff"
    )
