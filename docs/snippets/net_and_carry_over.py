lance.dataset(uri).merge_insert("id").when_matched_update_all().execute(
    pa.table({"id": [1], "s": ["a"]}))                          # version 4: rewrites id 1 as is
lance.dataset(uri).update({"s": "'w'"}, where="id = 2")          # version 5

# a replica's bootstrap: the table at version 3, then the changes of 4 and 5
boot = lance_cdf.read_changes(uri, 3, snapshot=True).read_all()
print(boot.select(["id", "s", "_change_type", "_commit_version"]).to_pylist())

# one event (an update: one pair) per row over versions 2..5
print(lance_cdf.read_changes(uri, 2, net=True).read_all().to_pylist())

# without version 4's carry-over update (its two images are equal)
print(lance_cdf.read_changes(uri, 4, drop_unchanged_updates=True).read_all().to_pylist())
