#!/usr/bin/env bash
# `make run`: starts `orchard serve` (local backend, in-process state) in the background,
# imports the python:3.11-slim test image, creates a sandbox from it, runs
# `python3 -c 'print(2+2)'` in it, and prints the two lines that point the SDK and the
# CLI at the service. `make stop` (scripts/stop.sh) stops it and removes what it made.
#
# Environment: ORCHARD_PORT (default 8000); ORCHARD_HARNESS=images/out/harness (after
# `make harness`) injects the harness CLIs into every sandbox: off by default, since the
# injector copies and verifies the whole 2 GiB bundle when the server starts.
# REPLICAS=N (`make run REPLICAS=3`): a redis-server (on a Unix socket, with AOF) and N
# replicas on ports ORCHARD_PORT.. sharing it and one data directory; any of them
# serves any sandbox, so the SDK may point at any (the lines printed name the first).
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
state=$top/.orchard-run
orchard=$top/target/release/orchard
port=${ORCHARD_PORT:-8000}

if [ -f "$state/server.pid" ] && kill -0 "$(cat "$state/server.pid")" 2>/dev/null; then
  echo "run: orchard serve is already running (pid $(cat "$state/server.pid")); \`make stop\` first" >&2
  exit 1
fi
scripts/stop.sh >/dev/null 2>&1 || true
mkdir -p "$state"
# The log holds the generated API key: readable by this user only.
chmod 700 "$state"
umask 077
# Sandbox sockets live under the data directory and a socket path must stay under 108
# bytes, so the data directory is short and outside the checkout.
data=/var/tmp/orchard-run-$(printf %s "$top" | sha256sum | cut -c1-8)
echo "$data" > "$state/data-dir"
harness_args=()
if [ -n "${ORCHARD_HARNESS:-}" ]; then
  harness_args=(--harness "$(realpath "$ORCHARD_HARNESS")")
fi

replicas=${REPLICAS:-1}
state_args=()
if [ "$replicas" -gt 1 ]; then
  command -v redis-server >/dev/null || { echo "run: REPLICAS needs redis-server (make deps)" >&2; exit 1; }
  sock=$state/redis.sock
  setsid redis-server --port 0 --unixsocket "$sock" --unixsocketperm 700 --dir "$state" \
    --save "" --appendonly yes --appendfsync everysec \
    </dev/null >"$state/redis.log" 2>&1 &
  echo $! > "$state/redis.pid"
  for _ in $(seq 1 100); do
    redis-cli -s "$sock" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  redis-cli -s "$sock" ping >/dev/null 2>&1 || { echo "run: redis-server did not start:" >&2; cat "$state/redis.log" >&2; exit 1; }
  state_args=(--state "redis+unix://$sock")
  echo "run: redis-server is up on $sock (log: $state/redis.log)"
fi

# Replica $1 on port+$1; the first one deletes every sandbox when `make stop` ends it.
start_replica() {
  local i=$1 suffix="" keep=()
  [ "$replicas" -gt 1 ] && [ "$i" = 0 ] && keep=(--keep-sandboxes-on-exit false)
  [ "$i" != 0 ] && suffix=".$i"
  rm -f "$state/url$suffix"
  setsid "$orchard" serve --listen "127.0.0.1:$((port + i))" --data-dir "$data" \
    --ready-file "$state/url$suffix" "${harness_args[@]}" "${state_args[@]}" "${keep[@]}" \
    </dev/null >"$state/server$suffix.log" 2>&1 &
  echo $! > "$state/server$suffix.pid"
  for _ in $(seq 1 300); do
    [ -s "$state/url$suffix" ] && break
    kill -0 "$(cat "$state/server$suffix.pid")" 2>/dev/null || break
    sleep 0.1
  done
  if [ ! -s "$state/url$suffix" ]; then
    echo "run: orchard serve did not start; its log:" >&2
    cat "$state/server$suffix.log" >&2
    exit 1
  fi
}
# The first generates the API key (saved in the data directory); the others read it.
for i in $(seq 0 $((replicas - 1))); do
  start_replica "$i"
done
export SANDBOX_BASE_URL=$(cat "$state/url")
export SANDBOX_API_KEY=$(cat "$data/api-key")
echo "run: orchard serve is up at $SANDBOX_BASE_URL (log: $state/server.log)"
for i in $(seq 1 $((replicas - 1))); do
  echo "run: replica $i is up at $(cat "$state/url.$i") (log: $state/server.$i.log)"
done

echo "run: importing python:3.11-slim"
"$orchard" image import "$top/images/out/python" --name python:3.11-slim
echo "run: creating a sandbox from python:3.11-slim"
id=$("$orchard" sandbox create python:3.11-slim)
echo "run: sandbox $id is ready"
echo "run: \$ python3 -c 'print(2+2)'"
"$orchard" sandbox exec "$id" -- python3 -c 'print(2+2)'
if [ "$replicas" -gt 1 ]; then
  last=$(cat "$state/url.$((replicas - 1))")
  echo "run: \$ python3 -c 'print(3+3)' through the last replica, $last"
  SANDBOX_BASE_URL=$last "$orchard" sandbox exec "$id" -- python3 -c 'print(3+3)'
fi

cat <<MSG

The service keeps running in the background (\`make stop\` ends it). Point the SDK and
the CLI at it with:

export SANDBOX_BASE_URL=$SANDBOX_BASE_URL
export SANDBOX_API_KEY=$SANDBOX_API_KEY

then, e.g.: target/release/orchard sandbox ls    target/release/orchard sandbox shell $id
MSG
