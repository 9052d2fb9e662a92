import lance_cdf.streaming

lance_cdf.streaming.register(spark)
spark.sql("SELECT id, s, _change_type, _commit_version "
          "FROM lance_table_changes('/tmp/events.lance', 2, 3)").show()
