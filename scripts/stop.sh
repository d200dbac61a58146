#!/usr/bin/env bash
# `make stop`: kills and deletes the sandbox `make run` started and removes its files.
set -uo pipefail
cd "$(dirname "$0")/.."
state=$PWD/.orchard-run
id=orchard-run
[ -d "$state" ] || { echo "stop: nothing running"; exit 0; }
if runc --root "$state/runc" state $id >/dev/null 2>&1; then
  runc --root "$state/runc" kill $id TERM 2>/dev/null
  for _ in $(seq 1 100); do
    [ "$(runc --root "$state/runc" state $id 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])' 2>/dev/null)" = stopped ] && break
    sleep 0.05
  done
  runc --root "$state/runc" delete --force $id 2>/dev/null
fi
rm -rf "$state"
echo "stop: sandbox removed"
