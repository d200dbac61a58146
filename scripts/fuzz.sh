#!/usr/bin/env bash
# Fuzzes the parsers that read untrusted bytes (fuzz/fuzz_targets/*.rs) for a bounded
# time each: installs cargo-fuzz when missing, builds every target on nightly, runs each
# from its committed seeds (fuzz/seeds/<target>) plus the corpus earlier runs grew
# (fuzz/corpus/<target>, not committed), prints one line per target and fails on any
# crash, leaving the input in fuzz/artifacts/<target>/.
#
#   scripts/fuzz.sh                 every target, FUZZ_TIME seconds each
#   scripts/fuzz.sh tar_extract     only the named targets
#   FUZZ_TIME=600 scripts/fuzz.sh   a longer run
#
# FUZZ_TIME (default 20) is the time per target; FUZZ_JOBS (default 2) how many run at
# once; FUZZ_SEED (default 1) libFuzzer's random seed, fixed so that CI explores the same
# inputs first on every run of a commit (0: a new seed each run, for exploring). A crash
# found once becomes a committed seed (fuzz/seeds/<target>/regression-*), replayed on
# every run. CI builds everything cold, so the defaults are for build time: the `dev` profile
# (no optimization; FUZZ_RELEASE=1 builds optimized, for long runs) and no sanitizer
# (the code is safe Rust over libgit2: what the run looks for is panics, the targets'
# invariant assertions included, and debug assertions and overflow checks are on).
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_TIME=${FUZZ_TIME:-20}
FUZZ_JOBS=${FUZZ_JOBS:-2}
FUZZ_SEED=${FUZZ_SEED:-1}
CARGO_FUZZ_VERSION=0.13.2
BUILD_FLAGS=(--sanitizer none)
if [ "${FUZZ_RELEASE:-0}" = 1 ]; then
  BUILD_FLAGS+=(--release --codegen-units 16)
  profile=release
else
  BUILD_FLAGS+=(--dev)
  profile=debug
fi

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "fuzz: error: cargo-fuzz needs the nightly toolchain, which is not installed" >&2
  echo "fuzz: install it with: rustup toolchain install nightly --profile minimal" >&2
  exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz $CARGO_FUZZ_VERSION"
  started=$SECONDS
  # Unoptimized: three times faster to build, and it only drives cargo.
  cargo install --quiet --locked --debug cargo-fuzz --version "$CARGO_FUZZ_VERSION"
  echo "fuzz: cargo-fuzz installed in $((SECONDS - started)) s"
fi

if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list --fuzz-dir fuzz)
fi

started=$SECONDS
build() {
  cargo +nightly fuzz build --fuzz-dir fuzz "${BUILD_FLAGS[@]}" "$@" 2>&1 \
    | { grep -Ev '^\s+(Compiling|Downloaded|Downloading|Fresh|Checking)\b' || true; }
  return "${PIPESTATUS[0]}"
}
if [ $# -gt 0 ]; then
  for t in "${targets[@]}"; do build "$t"; done
else
  build
fi
host=$(rustc +nightly -vV | sed -n 's/^host: //p')
bin_dir=fuzz/target/$host/$profile
for t in "${targets[@]}"; do
  [ -x "$bin_dir/$t" ] || { echo "fuzz: error: $t did not build" >&2; exit 1; }
done
echo "fuzz: built ${#targets[@]} targets in $((SECONDS - started)) s"

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# Runs one target; its summary line goes to $logs/<target>.line, its status to .rc.
run_one() {
  local t=$1 log=$logs/$1.log
  mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
  local rc=0
  # The targets' scratch directories (std::env::temp_dir) go with the run.
  mkdir -p "$logs/tmp"
  TMPDIR=$logs/tmp "$bin_dir/$t" -max_total_time="$FUZZ_TIME" -seed="$FUZZ_SEED" -timeout=20 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="fuzz/artifacts/$t/" \
    "fuzz/corpus/$t" "fuzz/seeds/$t" >"$log" 2>&1 || rc=$?
  local runs cov corpus
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1) || true
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2) || true
  corpus=$(find "fuzz/corpus/$t" -type f | wc -l) || true
  if [ "$rc" = 0 ]; then
    printf 'fuzz: %-16s ok      %8s runs in %s s, coverage %s, corpus %s\n' \
      "$t" "${runs:-?}" "$FUZZ_TIME" "${cov:-?}" "$corpus" >"$logs/$t.line"
  else
    {
      printf 'fuzz: %-16s FAILED  (exit %s) after %s runs\n' "$t" "$rc" "${runs:-?}"
      grep -E 'panicked at|^thread|Test unit written to|^==[0-9]+== ?ERROR|^SUMMARY' "$log" | head -20 | sed 's/^/    /'
      echo "    reproduce: $bin_dir/$t <the artifact above>"
      echo "    log tail:"
      tail -40 "$log" | sed 's/^/      /'
    } >"$logs/$t.line"
  fi
  echo "$rc" >"$logs/$t.rc"
}

for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$FUZZ_JOBS" ]; do wait -n || true; done
  run_one "$t" &
done
wait

failed=0
for t in "${targets[@]}"; do
  cat "$logs/$t.line"
  [ "$(cat "$logs/$t.rc")" = 0 ] || failed=$((failed + 1))
done
if [ "$failed" -gt 0 ]; then
  echo "fuzz: $failed of ${#targets[@]} targets FAILED" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${FUZZ_TIME} s each, no crash"
