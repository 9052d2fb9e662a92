import lance_cdf.spark

source = query.lastProgress["sources"][0]
print(source["endOffset"], source["latestOffset"])  # {"version": 3, "table": ...} and {"version": 3}
print(lance_cdf.spark.lag(query))               # 0
