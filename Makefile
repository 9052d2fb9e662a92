# lance-cdf: `make test` runs the whole suite from a clean clone; `make demo` runs the pipeline.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_SECONDS ?= 60
# two pytest workers (one per core; much of a test is waiting), each with its own services
# (one session each), the longest work handed out first (tests/support/schedule.py, `make
# durations`); TEST_WORKERS= runs the tests in one process
TEST_WORKERS ?= -n 2 --dist loadgroup --no-loadscope-reorder
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: venv test test-unit test-integration durations demo proto provision provision-demo bench lint docs clean

$(STAMP): pyproject.toml setup.py lance_cdf/format/_decode.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# compat: the project root on sys.path, so PySpark's lookup of `pyspark_*` modules
	# (pkgutil.iter_modules) finds pyspark_lance_cdf; the default (lenient) editable
	# install hides it behind an import hook that iter_modules does not see.
	$(PY) -m pip install -q -e '.[all,test,dev,docs]' --config-settings editable_mode=compat
	touch $(STAMP)

venv: $(STAMP)

# Local Kafka broker + schema registry jars (cached under .cache/, git-ignored).
# `provision-demo`: what the demo needs (broker, registry); `provision` adds what only the
# tests use (Kafka Connect, the Debezium JDBC sink, embedded PostgreSQL) and the class-data
# archives their JVMs start from (tests/support/jvm_archives.py, tests/support/short_jvms.py).
provision-demo: $(STAMP)
	$(PY) -m lance_cdf_devtools provision

provision: provision-demo
	$(PY) -m lance_cdf_devtools connect
	$(PY) -m tests.support.jvm_archives

# CI's command: the linters (ruff, mypy), the documentation site, then every test. pytest
# exits non-zero (5) when it collects nothing, so an empty run fails too.
test: lint docs provision
	$(PY) -m pytest $(TEST_WORKERS) $(PYTEST_ARGS)

# The unit tests alone (`-m unit`, see tests/support/classify.py): no JVM, broker, registry,
# Spark or S3 server, so no jars to provision; with LANCE_CDF_UNIT_ONLY=1 the service
# fixtures, devtools' services and `java` itself fail loudly if anything tries.
test-unit: $(STAMP)
	LANCE_CDF_UNIT_ONLY=1 $(PY) -m pytest -m unit $(PYTEST_ARGS)

# the tests' durations of this run, for tests/support/schedule.py to hand the longest out first
durations: provision
	LANCE_CDF_STORE_DURATIONS=tests/durations.json $(PY) -m pytest $(TEST_WORKERS) $(PYTEST_ARGS)

test-integration: provision
	$(PY) -m pytest $(TEST_WORKERS) -m integration $(PYTEST_ARGS)

demo: provision-demo
	$(PY) -m lance_cdf_demo --seconds $(DEMO_SECONDS) $(DEMO_ARGS)

# Regenerate lance_cdf/format/_proto from protos/ (generated modules are committed).
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Iprotos --python_out=lance_cdf/format/_proto \
		--pyi_out=lance_cdf/format/_proto protos/file.proto protos/table.proto \
		protos/rowids.proto protos/transaction.proto
	sed -i -E 's/^import (file|table|rowids|transaction)_pb2 as/from . import \1_pb2 as/' \
		lance_cdf/format/_proto/*_pb2.py

# The benchmarks run as modules from the project root (BENCHMARKS.md): bench/<package>/,
# raw results into bench/results/, charts into bench/figures/.
bench: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) -m bench.core.bench_core --rows 1000000 10000000 --fragments 10 --repeat 3 \
		--out bench/results/results_core.json
	$(PY) -m bench.core.plot_core bench/results/results_core.json bench/figures/core_extraction.png
	$(PY) -m bench.core.bench_plan --rows 1000000 10000000 --dir bench/out --reuse --repeat 20 \
		--out bench/results/results_plan.json

lint: $(STAMP)
	$(VENV)/bin/ruff check lance_cdf lance_cdf_devtools lance_cdf_demo pyspark_lance_cdf pyspark_lance_cdf_kafka tests bench docs
	$(VENV)/bin/ruff format --check lance_cdf lance_cdf_devtools lance_cdf_demo pyspark_lance_cdf pyspark_lance_cdf_kafka tests bench docs
	$(VENV)/bin/mypy

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link, a missing
# API reference or a snippet that is not there fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info site
