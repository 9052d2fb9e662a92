feed = lance_cdf.ChangeFeed(uri)
for version in range(2, feed.latest_version() + 1):   # readers opened once, reused per version
    plan = feed.plan(version)
    rows = sum(b.num_rows for b in feed.events(plan, feed.user_schema(version, version)))
    print(version, plan.summary()["operation"], rows)
