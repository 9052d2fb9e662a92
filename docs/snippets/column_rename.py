lance.write_dataset(pa.table({"id": [1, 2], "s": ["a", "b"]}), uri, mode="overwrite",
                    enable_stable_row_ids=True)                      # v1
lance.dataset(uri).alter_columns({"path": "s", "name": "t"})         # v2: rename, no events
lance.dataset(uri).update({"t": "'B'"}, where="id = 2")              # v3
print(lance_cdf.read_changes(uri, 1, snapshot=True, net=True).read_all().to_pylist())
# [{'id': 1, 't': 'a', ...'snapshot'...}, {'id': 2, 't': 'B', ...}]
