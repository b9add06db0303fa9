"""What tests and the torture harness need besides the product's own dev stack
(`detector.devstack`): test doubles (a PagerDuty Events endpoint, an OTLP receiver, a TCP
proxy), the findings view under a browser, and the torture harness. No other module of
`detector` imports it (`tests/unit/test_layers.py`), so the wheel leaves it out (pyproject.toml):
tests, `bench/` and `scripts/` import it from the checkout."""
