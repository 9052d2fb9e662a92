feed = lance_cdf.ChangeFeed(uri)
plan = feed.plan(2)                 # reads manifests only: which rows changed, no data
print(plan.summary())               # {'version': 2, 'operation': 'Update', 'inserted': 0, 'updated': 1, 'deleted': 0}
schema = feed.user_schema(2, 2)
for batch in feed.events(plan, schema):
    print(batch.to_pydict())
