#!/usr/bin/env bash
# `make bench` part: the Python SDK's round trips next to raw HTTP and the long soak, against a release
# `orchard serve` started here on a temporary data directory (removed afterwards).
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
data=$(mktemp -d /tmp/orchard-bench-XXXXXX)
key=bench-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
target/release/orchard serve --listen 127.0.0.1:0 --data-dir "$data" --api-key "$key" \
  --ready-file "$data/url" --log-level warn </dev/null >"$data/server.log" 2>&1 &
pid=$!
cleanup() {
  kill -TERM $pid 2>/dev/null || true
  wait $pid 2>/dev/null || true
  rm -rf "$data"
}
trap cleanup EXIT
for _ in $(seq 1 300); do [ -s "$data/url" ] && break; sleep 0.1; done
export SANDBOX_BASE_URL=$(cat "$data/url") SANDBOX_API_KEY=$key
(cd images/out/busybox && tar cf - .) |
  curl -sf -H "X-API-Key: $key" --data-binary @- "$SANDBOX_BASE_URL/v1/images/import?name=busybox:latest" >/dev/null
python3 sdk/python/bench/bench_sdk.py --out "$top/bench/results/sdk.md"
# The long soak: idle gaps past common proxy timeouts (about rounds x 65 s).
python3 sdk/python/bench/soak.py --out "$top/bench/results/soak.md"
