blob = pa.field("img", pa.large_binary(), metadata={"lance-encoding:blob": "true"})
lance.write_dataset(pa.table({"id": [1], "img": [b"\x89PNG"]}, pa.schema([("id", pa.int64()), blob])),
                    "/tmp/blobs.lance", mode="overwrite", enable_stable_row_ids=True)
print(lance_cdf.read_changes("/tmp/blobs.lance", 1).read_all()["img"].to_pylist())   # [b'\x89PNG']
