feed = lance_cdf.ChangeFeed(uri, check_latest=False)
schema = feed.user_schema(2, 5)
for batch in feed.range_events(feed.plans(2, 5), schema):   # versions 2..5, in order
    print(batch.num_rows)
