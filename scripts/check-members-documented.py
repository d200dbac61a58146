#!/usr/bin/env python3
"""Fails when a workspace member is missing from docs/architecture.md (or the README's
layout table, given as DOC). Part of `make lint`.

Every member listed in the root Cargo.toml's `[workspace] members` (globs expanded) must
have its row in the document's crate table: a line starting with `|` that names both
the package, `` `orchard-x` ``, and its directory, `` `x/` ``. A new crate then cannot
land without saying where it sits.

    scripts/check-members-documented.py                 the root workspace and the document
    scripts/check-members-documented.py CARGO.toml DOC  another manifest or document
"""
import glob
import os
import sys
import tomllib


def members(manifest):
    """(directory, package name) of every member of the workspace at `manifest`."""
    root = os.path.dirname(os.path.abspath(manifest))
    with open(manifest, 'rb') as f:
        listed = tomllib.load(f).get('workspace', {}).get('members', [])
    found = []
    for pattern in listed:
        for path in sorted(glob.glob(os.path.join(root, pattern))) or [os.path.join(root, pattern)]:
            member = os.path.join(path, 'Cargo.toml')
            if not os.path.isfile(member):
                continue  # not a package (a glob can match other directories)
            with open(member, 'rb') as f:
                name = tomllib.load(f).get('package', {}).get('name')
            found.append((os.path.relpath(path, root), name))
    return found


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    manifest = argv[0] if argv else os.path.join(here, '..', 'Cargo.toml')
    doc = argv[1] if len(argv) > 1 else os.path.join(here, '..', 'docs', 'architecture.md')
    with open(doc) as f:
        rows = [line for line in f if line.lstrip().startswith('|')]
    missing = []
    listed = members(manifest)
    for directory, name in listed:
        if not name:
            missing.append(f'{directory}/ (no [package] name in its Cargo.toml)')
        elif not any(f'`{name}`' in row and f'`{directory}/`' in row for row in rows):
            missing.append(f'{name} ({directory}/)')
    doc_name = os.path.relpath(doc, os.path.join(here, '..'))
    if missing:
        for m in missing:
            print(f'{doc_name}: workspace member {m} is missing from the crate table '
                  '(a row naming the package and its directory)', file=sys.stderr)
        return 1
    print(f'{doc_name}: all {len(listed)} workspace members documented')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
