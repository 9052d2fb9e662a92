lance_cdf.read_changes(uri, 1, columns=[]).read_all().group_by("_commit_version").aggregate([([], "count_all")])
