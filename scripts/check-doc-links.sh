#!/usr/bin/env bash
# Checks that the README and docs/*.md point only at files inside the repository, so their
# links resolve in a fresh clone. Part of `make lint`.
#
# For every relative Markdown link, inline `[text](target)` or reference `[label]: target`
# (fenced code blocks skipped; URLs with a scheme and `#anchor`-only links left alone), the
# target, without its `#anchor` or `?query`, must exist, resolved against the file's own
# directory, and must stay inside the repository. A path in backticks that starts with `../`
# points outside the repository and is refused too: that is how `../shared/DESIGN.md`
# crept in before.
#
#   scripts/check-doc-links.sh              README.md, docs/*.md and the SDK README
#   scripts/check-doc-links.sh FILE.md ...  only these files
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [ $# -gt 0 ]; then
  files=("$@")
else
  files=(README.md docs/*.md sdk/python/README.md)
fi

bad=0
for file in "${files[@]}"; do
  dir=$(dirname "$file")
  # Prose only: drop fenced code blocks (``` or ~~~), keep line numbers.
  prose=$(awk '/^[ \t]*(```|~~~)/ { fence = !fence; print ""; next } { print fence ? "" : $0 }' "$file")

  while IFS=: read -r line target; do
    [ -n "$target" ] || continue
    case $target in
      *://* | mailto:* | '#'*) continue ;;
    esac
    path=${target%%#*}
    path=${path%%\?*}
    [ -n "$path" ] || continue
    resolved=$(realpath -m "$dir/$path")
    if [ "${resolved#"$root"/}" = "$resolved" ] && [ "$resolved" != "$root" ]; then
      echo "$file:$line: link to $target points outside the repository"
      bad=1
    elif [ ! -e "$resolved" ]; then
      echo "$file:$line: link to $target: no such file"
      bad=1
    fi
  done < <(
    # Inline links: ](target) or ](target "title").
    grep -noE '\]\([^)[:space:]]+' <<<"$prose" | sed -E 's/^([0-9]+):\]\(/\1:/' || true
    # Reference definitions: [label]: target
    grep -noE '^ {0,3}\[[^]]+\]:[[:space:]]+[^[:space:]]+' <<<"$prose" |
      sed -E 's/^([0-9]+):.*\]:[[:space:]]+/\1:/; s/^([0-9]+):<(.*)>$/\1:\2/' || true
  )

  while IFS=: read -r line span; do
    [ -n "$span" ] || continue
    echo "$file:$line: $span points outside the repository"
    bad=1
  done < <(grep -noE '`\.\./[^`]*`' <<<"$prose" || true)
done

if [ $bad -ne 0 ]; then
  echo "doc links: fix the links above (point them inside the repository, or remove them)" >&2
  exit 1
fi
echo "doc links: ${#files[@]} files, every relative link resolves inside the repository"
