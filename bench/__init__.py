"""The benchmarks, laid out by package: `bench/<package>/bench_*.py` for the part of
lance_cdf each measures (core, format, avro, kafka, spark, replicate, ops),
`bench/support/` for what the scripts share (tables, the statistics they report, S3
request counts, the programs they start), `bench/results/` for the raw results the
Benchmarks page (docs/benchmarks.md) cites and `bench/figures/` for its charts.

Every script runs as a module from the project root, so the checkout's own lance_cdf
and bench are the ones imported (the working directory comes first on sys.path):

    .venv/bin/python -m bench.core.bench_core --rows 1000000 --out bench/results/results_core.json
"""
