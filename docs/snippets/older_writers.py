import lance_cdf
from lance_cdf import plan_version

uri = "tests/support/fixtures/old_tables/pylance-0.36.0.lance"   # written by pylance 0.36.0
feed = lance_cdf.ChangeFeed(uri)
print(feed.table.manifest(2).writer)                   # lance 0.36.0
print(plan_version(feed.table, 2).summary())           # {..., 'updated': 0, 'deleted': 0, 'undecided': 9}
print(feed.plan(2).summary())                          # {..., 'updated': 9, 'deleted': 0}  (values compared)
t = lance_cdf.read_changes(uri, 2, 2, columns=["id", "s"]).read_all()
print(t.select(["_rowid", "_change_type", "s"]).slice(0, 2).to_pylist())
# [{'_rowid': 0, '_change_type': 'update_preimage', 's': 'yew8'},
#  {'_rowid': 0, '_change_type': 'update_postimage', 's': 'yew8!'}]
