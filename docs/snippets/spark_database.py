changes = (spark.readStream.format("lance-cdf").option("database", "/tmp/db")
           .option("include", r"sales\..*|items").option("startingVersion", 1).load())
query = changes.writeStream.format("memory").queryName("dbc").trigger(availableNow=True).start()
query.awaitTermination()

spark.sql("SELECT _table, _change_type, count(*) FROM dbc GROUP BY 1, 2").show()
spark.read.format("lance-cdf").option("database", "/tmp/db").load().groupBy("_table").count().show()
