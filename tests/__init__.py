"""The test suite, laid out by package: `tests/<package>/test_*.py` for each package of
lance_cdf (core, format, avro, kafka, spark, replicate, ops, cli) where the code a test
mainly exercises lives, `tests/project/` for the project itself (layout, docs, devtools,
demo, compose), `tests/support/` for what the tests share (oracles, workloads, the pytest
plugins `tests/conftest.py` loads, the jobs run in subprocesses, fixtures). Imported as
packages from the project root (`from tests.support.oracle import table_state`)."""
