#!/usr/bin/env bash
# `make run` until the orchestrator exists: starts orchard-agent as PID 1 of a runc
# sandbox (busybox rootfs, read-only root, writable /tmp, loopback-only network) in the
# background, runs a first command in it through the agent's Unix socket, and prints
# how to reach it. `make stop` (scripts/stop.sh) removes everything.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
state=$top/.orchard-run
id=orchard-run
agent=${ORCHARD_AGENT_BIN:-$top/target/x86_64-unknown-linux-musl/release/orchard-agent}
runc_root=$state/runc

if [ -e "$state/bundle/config.json" ] && runc --root "$runc_root" state $id >/dev/null 2>&1; then
  echo "run: a sandbox is already running; \`make stop\` first" >&2
  exit 1
fi
scripts/stop.sh >/dev/null 2>&1 || true

bundle=$state/bundle
mkdir -p "$bundle/rootfs/bin" "$bundle/rootfs/etc" "$bundle/rootfs/workspace" "$state/bin" "$state/sock" "$runc_root"
cp /bin/busybox "$bundle/rootfs/bin/busybox"
for applet in $(/bin/busybox --list); do [ "$applet" = busybox ] || ln -sf busybox "$bundle/rootfs/bin/$applet"; done
echo 'root:x:0:0:root:/root:/bin/sh' > "$bundle/rootfs/etc/passwd"
cp "$agent" "$state/bin/orchard-agent"
token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "$token" > "$state/token"
chmod 600 "$state/token"

rm -f "$bundle/config.json"
runc spec --bundle "$bundle"
python3 - "$bundle/config.json" "$state" "$token" <<'PY'
import json, sys
path, state, token = sys.argv[1:]
c = json.load(open(path))
c["process"]["terminal"] = False
c["process"]["args"] = ["/.orchard/bin/orchard-agent", "--unix", "/.orchard/run/agent.sock"]
c["process"]["env"] = ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root",
                       "ORCHARD_AGENT_TOKEN=" + token]
c["process"]["cwd"] = "/workspace"
c["root"] = {"path": "rootfs", "readonly": True}
c["hostname"] = "orchard-run"
c["mounts"] += [
    {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
     "options": ["nosuid", "nodev", "mode=1777"]},
    {"destination": "/workspace", "type": "tmpfs", "source": "tmpfs",
     "options": ["nosuid", "nodev", "mode=755"]},
    {"destination": "/.orchard/bin", "type": "bind", "source": state + "/bin",
     "options": ["rbind", "ro"]},
    {"destination": "/.orchard/run", "type": "bind", "source": state + "/sock",
     "options": ["rbind", "rw"]},
]
c["linux"].setdefault("resources", {})["pids"] = {"limit": 512}
json.dump(c, open(path, "w"), indent=2)
PY

runc --root "$runc_root" run --detach --bundle "$bundle" --pid-file "$state/pid" $id \
  </dev/null >"$state/agent.log" 2>&1
sock=$state/sock/agent.sock
for _ in $(seq 1 200); do
  curl -sf --unix-socket "$sock" http://agent/livez >/dev/null 2>&1 && break
  sleep 0.05
done
if ! curl -sf --unix-socket "$sock" http://agent/livez >/dev/null 2>&1; then
  echo "run: the agent did not come up; its log:" >&2
  cat "$state/agent.log" >&2
  exit 1
fi

echo "run: sandbox $id is up (agent pid 1, socket $sock)"
echo "run: \$ uname -a; echo \$((2+2))"
curl -s --unix-socket "$sock" -H "x-orchard-token: $token" http://agent/v1/exec \
  -d '{"command":"uname -a; echo $((2+2))"}' |
  python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["stdout"]["data"], end=""); print("exit", r["exit_code"], "in", round(r["duration_ms"],2), "ms")'
cat <<MSG

The agent keeps running in the background. Talk to it with:
  export ORCHARD_AGENT_SOCKET=$sock
  export ORCHARD_AGENT_TOKEN=$token
  curl -s --unix-socket \$ORCHARD_AGENT_SOCKET -H "x-orchard-token: \$ORCHARD_AGENT_TOKEN" http://agent/v1/exec -d '{"command":"ls /"}'
Stop it with: make stop
MSG
