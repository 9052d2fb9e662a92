spark.sql("""
    CREATE TEMPORARY VIEW events_changes USING `lance-cdf`
    OPTIONS (path '/tmp/events.lance', startingVersion 1, endingVersion 3)
""")
spark.sql("SELECT _change_type, count(*) FROM events_changes GROUP BY 1").show()
