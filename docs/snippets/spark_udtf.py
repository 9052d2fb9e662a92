import lance_cdf.spark

lance_cdf.spark.register(spark)
spark.sql("SELECT id, s, _change_type, _commit_version "
          "FROM lance_table_changes('/tmp/events.lance', 2, 3)").show()
