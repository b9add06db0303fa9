"""Metrics (and later traces) of the detector itself. Labels are bounded: never a workflow key."""
