lance-cdf changes /tmp/events.lance --from 3 --snapshot --format jsonl
lance-cdf changes /tmp/events.lance --from 2 --net
lance-cdf changes /tmp/events.lance --from 4 --drop-unchanged-updates
