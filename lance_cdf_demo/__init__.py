"""`make demo`: the whole pipeline on this machine, for a database of three tables.

    writer (random commits) -> source/ (items, users, sales.orders: a Lance directory
        namespace) -> one lance-cdf publish --database (Spark) -> Kafka (Avro, a topic
        per table) -> one lance-cdf replicate --database-target -> replica/, each table
        checked equal to its source at the end

Modules: sample (the sample database and its random commits), pipeline (starts and stops
the services and processes), progress (the live display), walkthrough (the
feed-only tour: `python -m lance_cdf_demo --walkthrough`).
"""
