"""The fault-injection campaign: each source's real coordination system, a fleet of workers on it
making effects at a recording destination that writes down the ground truth, a seeded nemesis of
ordinary faults and real zombies, and a checker matching the findings a downstream reader sees
against that truth (`bench/campaign.py` runs it; docs/campaign.md holds the results)."""
