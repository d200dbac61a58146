#!/usr/bin/env python3
"""Helpers of images/harness/build.sh: manifest queries, digests, digest lists.

Kept in Python because hashing a couple of GB is several times faster through hashlib
(OpenSSL) than through sha256sum, and because reading JSON in shell needs jq.

  util.py artifacts COMPONENT            one line per artifact: registry name version digest variant
  util.py key COMPONENT RECIPE           cache key of a component (its pins, its lock file, its recipe)
  util.py integrity FILE                 npm style sha512-<base64>
  util.py sha256 FILE
  util.py npm-lock-integrity LOCK NAME   dist integrity recorded for node_modules/NAME in a package-lock
  util.py sums ROOT DIR                  "sha256  path" of every file under ROOT/DIR, paths relative to ROOT
  util.py check ROOT SUMFILE             verifies a list written by sums (exit 1 on the first mismatch)
  util.py sizes ROOT                     bytes per component and in total, as a table
"""
import base64
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.environ.get("ORCHARD_HARNESS_MANIFEST", os.path.join(HERE, "manifest.json"))


def manifest():
    with open(MANIFEST) as f:
        return json.load(f)


def component(name):
    m = manifest()
    for section in ("tools", "runtimes"):
        if name in m.get(section, {}):
            return m[section][name]
    sys.exit(f"harness: no component {name!r} in {MANIFEST}")


def file_digest(path, algo):
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                break
            h.update(block)
    return h


def cmd_artifacts(name):
    for a in component(name)["artifacts"]:
        digest = a.get("integrity") or a.get("sha256")
        if not digest:
            sys.exit(f"harness: artifact {a['name']} of {name} has no digest in the manifest")
        print(a["registry"], a["name"], a["version"], digest, a.get("variant", "-"), a.get("file", "-"))


def cmd_key(name, recipe):
    c = component(name)
    h = hashlib.sha256()
    h.update(json.dumps(c, sort_keys=True).encode())
    h.update(recipe.encode())
    if "lock" in c:
        h.update(file_digest(os.path.join(HERE, c["lock"]), "sha256").digest())
    print(h.hexdigest())


def cmd_integrity(path):
    print("sha512-" + base64.b64encode(file_digest(path, "sha512").digest()).decode())


def cmd_sha256(path):
    print(file_digest(path, "sha256").hexdigest())


def cmd_npm_lock_integrity(lock, name):
    with open(lock) as f:
        entry = json.load(f)["packages"].get("node_modules/" + name)
    if not entry:
        sys.exit(f"harness: {name} is not in {lock}")
    print(entry.get("integrity", ""))


def walk_files(root, sub):
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, sub)):
        dirnames.sort()
        for fn in sorted(filenames):
            p = os.path.join(dirpath, fn)
            if os.path.isfile(p) and not os.path.islink(p):
                yield os.path.relpath(p, root)


def cmd_sums(root, sub):
    out = sys.stdout
    for rel in walk_files(root, sub):
        out.write(f"{file_digest(os.path.join(root, rel), 'sha256').hexdigest()}  {rel}\n")


def cmd_check(root, sumfile):
    with open(sumfile) as f:
        for line in f:
            digest, rel = line.rstrip("\n").split("  ", 1)
            p = os.path.join(root, rel)
            if not os.path.isfile(p):
                sys.exit(f"missing: {rel}")
            if file_digest(p, "sha256").hexdigest() != digest:
                sys.exit(f"changed: {rel}")


def tree_size(path):
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for fn in filenames:
            p = os.path.join(dirpath, fn)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def cmd_sizes(root):
    lib = os.path.join(root, "lib")
    rows = []
    for name in sorted(os.listdir(lib)):
        p = os.path.join(lib, name)
        if os.path.isdir(p):
            rows.append((name, tree_size(p)))
    total = tree_size(root)
    width = max(len(r[0]) for r in rows + [("total", 0)])
    for name, size in rows:
        print(f"  {name:<{width}}  {human(size):>10}")
    print(f"  {'total':<{width}}  {human(total):>10}  ({total} bytes)")


def main(argv):
    cmds = {
        "artifacts": (cmd_artifacts, 1),
        "key": (cmd_key, 2),
        "integrity": (cmd_integrity, 1),
        "sha256": (cmd_sha256, 1),
        "npm-lock-integrity": (cmd_npm_lock_integrity, 2),
        "sums": (cmd_sums, 2),
        "check": (cmd_check, 2),
        "sizes": (cmd_sizes, 1),
    }
    if len(argv) < 2 or argv[1] not in cmds or len(argv) - 2 != cmds[argv[1]][1]:
        sys.exit(__doc__)
    cmds[argv[1]][0](*argv[2:])


if __name__ == "__main__":
    main(sys.argv)
