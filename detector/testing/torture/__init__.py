"""The torture harness: a generated history published while faults hit live workers, judged
against `audit` of the same history. `tests/torture` runs it in CI, `scripts/torture.py` by hand."""
