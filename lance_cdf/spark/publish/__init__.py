"""The Spark job behind `lance-cdf publish`: the session and query (runner), the head start
from an existing checkpoint (headstart), and the progress and lag it reports
(query_progress)."""
