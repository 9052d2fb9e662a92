lance-cdf changes /tmp/events.lance --from 1
