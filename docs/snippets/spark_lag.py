import lance_cdf.spark.source

source = query.lastProgress["sources"][0]
print(source["endOffset"], source["latestOffset"])  # {"version": 3, "table": ...} and {"version": 3}
print(lance_cdf.spark.source.lag(query))               # 0
