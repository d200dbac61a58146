#!/usr/bin/env bash
# `make stop`: stops the `orchard serve` that `make run` started (SIGTERM: it deletes
# every sandbox it holds; with REPLICAS, every replica and Redis) and removes its data
# directory and state.
set -uo pipefail
cd "$(dirname "$0")/.."
state=$PWD/.orchard-run
[ -d "$state" ] || { echo "stop: nothing running"; exit 0; }
# Ends process $1 (SIGTERM, a minute to finish, then SIGKILL).
end() {
  local pid=$1
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid"
  for _ in $(seq 1 600); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  echo "stop: process $pid did not exit; killing it" >&2
  kill -KILL "$pid" 2>/dev/null
}
# The extra replicas of `make run REPLICAS=N` first (they keep the shared sandboxes),
# then the first, which deletes every sandbox, then Redis.
for f in "$state"/server.*.pid; do
  [ -f "$f" ] && end "$(cat "$f")"
done
# It deletes its sandboxes before exiting; `end` gives that a minute.
[ -f "$state/server.pid" ] && end "$(cat "$state/server.pid")"
[ -f "$state/redis.pid" ] && end "$(cat "$state/redis.pid")"
if [ -f "$state/data-dir" ]; then
  data=$(cat "$state/data-dir")
  # Overlay mounts of sandboxes left by a killed server must go before the directory.
  if [ -d "$data" ]; then
    grep -F " $data/" /proc/mounts | awk '{print $2}' | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
    rm -rf "$data"
  fi
fi
# The sandbox of the earlier, agent-only `make run`, if one is left.
if [ -d "$state/runc" ]; then
  runc --root "$state/runc" delete --force orchard-run 2>/dev/null
fi
rm -rf "$state"
echo "stop: orchard serve stopped, its sandboxes and data removed"
