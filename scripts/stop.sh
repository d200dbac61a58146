#!/usr/bin/env bash
# `make stop`: stops the `orchard serve` that `make run` started (SIGTERM: it deletes
# every sandbox it holds) and removes its data directory and state.
set -uo pipefail
cd "$(dirname "$0")/.."
state=$PWD/.orchard-run
[ -d "$state" ] || { echo "stop: nothing running"; exit 0; }
if [ -f "$state/server.pid" ]; then
  pid=$(cat "$state/server.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    # It deletes its sandboxes before exiting; give that a minute.
    for _ in $(seq 1 600); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "stop: orchard serve did not exit; killing it" >&2
      kill -KILL "$pid" 2>/dev/null
    fi
  fi
fi
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
