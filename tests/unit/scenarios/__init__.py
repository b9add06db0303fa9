"""Small histories written from DESIGN §4, each asserting what the on-call human would see.

One module per kind of history (acceptance, conditions, duplicates, order, revisions, resolution,
redelivery, lease health, eviction and caps, state, job-queue logs). The builders (`acq`,
`takeover`, `commit`, `verify`, `stale_commit`, `seed_history`, ...) live in
`tests/unit/histories.py`."""
