#!/bin/bash
# LocalStack init hook (docker-compose.yml mounts this folder at
# /etc/localstack/init/ready.d): runs inside the container once LocalStack is
# ready. Creates the stream `KCL_DEMO_STREAM=kcl-demo make demo` uses, so the
# Docker path has something to look at right away. Idempotent: LocalStack keeps
# no state across restarts, but the hook may be re-run by hand.
set -euo pipefail

stream="${KCL_DEMO_STREAM:-kcl-demo}"
if awslocal kinesis describe-stream-summary --stream-name "$stream" >/dev/null 2>&1; then
    echo "kcl: stream $stream already exists"
else
    awslocal kinesis create-stream --stream-name "$stream" --shard-count 4
    awslocal kinesis wait stream-exists --stream-name "$stream"
    echo "kcl: created stream $stream (4 shards)"
fi
