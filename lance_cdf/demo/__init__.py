"""`make demo`: the whole pipeline on this machine.

    writer (random commits) -> source.lance -> lance-cdf publish (Spark) -> Kafka (Avro)
        -> lance-cdf replicate -> replica.lance, checked equal to the source at the end

Modules: sample (the sample table and its random commits), pipeline (starts and stops
the services and processes), progress (the live display), walkthrough (the
feed-only tour: `python -m lance_cdf.demo --walkthrough`).
"""
