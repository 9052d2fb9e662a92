import lance, pyarrow as pa, lance_cdf

uri = "/tmp/events.lance"
lance.write_dataset(pa.table({"id": [1, 2, 3], "s": ["a", "b", "c"]}), uri,
                    mode="overwrite", enable_stable_row_ids=True)   # stable row IDs are required
lance.dataset(uri).update({"s": "'z'"}, where="id = 2")          # version 2
lance.dataset(uri).delete("id = 3")                              # version 3

reader = lance_cdf.read_changes(uri, 1)          # versions 1..latest, a pyarrow.RecordBatchReader
print(reader.read_all().to_pandas())
