lance-cdf publish --table /tmp/events.lance --bootstrap-servers 127.0.0.1:9092 \
    --topic events.cdf --schema-registry http://127.0.0.1:8081/apis/ccompat/v7 \
    --checkpoint /tmp/events-publish-ck --starting-version 1 --available-now
lance-cdf replicate --bootstrap-servers 127.0.0.1:9092 --topic events.cdf \
    --schema-registry http://127.0.0.1:8081/apis/ccompat/v7 \
    --target /tmp/events-replica.lance --idle-timeout 10
