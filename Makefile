# Orchard Env — the two commands a newcomer needs are `make run` and `make test`.
SHELL := /bin/bash
MUSL_TARGET := x86_64-unknown-linux-musl
AGENT_BIN := target/$(MUSL_TARGET)/release/orchard-agent
export ORCHARD_AGENT_BIN := $(CURDIR)/$(AGENT_BIN)

.PHONY: all deps agent build test lint unit openapi bench run stop clean

all: build

## deps: install what a fresh Debian machine lacks (apt packages, the musl target).
deps:
	@scripts/deps.sh

## agent: the static musl agent binary.
agent: deps
	cargo build --release --target $(MUSL_TARGET) -p orchard-agent
	@file $(AGENT_BIN) | grep -q 'statically linked' || { echo "error: $(AGENT_BIN) is not statically linked"; file $(AGENT_BIN); exit 1; }
	@echo "agent: $(AGENT_BIN) ($$(stat -c %s $(AGENT_BIN)) bytes, static)"

## k8s-images: the Kubernetes images (FROM scratch, static binaries) as OCI layouts in
## images/out/: the injector (init container: injector + agent) and the orchestrator;
## see images/scratch-images.sh.
.PHONY: k8s-images
k8s-images: agent
	cargo build --release --target $(MUSL_TARGET) -p orchard-injector -p orchard
	@images/scratch-images.sh injector orchestrator

build: agent
	cargo build --workspace

## lint: formatting, clippy (also of the orchestrator without its default features:
## no Kubernetes, no Redis), doc links, every workspace member in docs/architecture.md
## and in the README's layout table (scripts/check-members-documented.py), and no import circle between the modules of
## any crate (scripts/import-cycles.py).
lint:
	@scripts/check-doc-links.sh
	@scripts/check-members-documented.py
	@scripts/check-members-documented.py Cargo.toml README.md
	@scripts/import-cycles.py $(wildcard */src)
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy -p orchard --no-default-features --all-targets -- -D warnings

## test: everything CI checks.
test: agent k8s-build-background images k8s-images harness lint sdk-deps fuzz
	cargo test --workspace
	@images/harness/test.sh
	$(SDK_PYTEST)
	@tests/k8s/smoke.sh
	@tests/k8s/backend.sh

## k8s-build-background: the test cluster's cold build (about 15 min of Go on 2 cores),
## niced and overlapped with the rest of `make test`; the smoke test waits for it.
.PHONY: k8s-build-background
k8s-build-background:
	@tests/k8s/build.sh --background

## cluster: a single-node Kubernetes cluster on this machine, built from pinned Go modules
## (cached), with the test images imported; prints `export KUBECONFIG=...`.
## cluster-down: stops it and removes everything it made. See tests/k8s/README.md.
.PHONY: cluster cluster-down cluster-test
cluster: images k8s-images
	@tests/k8s/up.sh

cluster-down:
	@tests/k8s/down.sh

## cluster-test: only the cluster's smoke test (starts and stops the cluster).
cluster-test: images
	@tests/k8s/smoke.sh

## fuzz: the cargo-fuzz targets (fuzz/) of the parsers that read untrusted bytes (tar,
## patches, image manifests and layers, request bodies, PTY frames), FUZZ_TIME seconds
## each (default 20); installs cargo-fuzz when missing. See scripts/fuzz.sh.
.PHONY: fuzz
fuzz:
	@scripts/fuzz.sh

## sdk-deps: the Python SDK, editable, with its test and lint tools.
.PHONY: sdk-deps sdk-test
sdk-deps:
	python3 -m pip install -q --disable-pip-version-check -e "sdk/python[dev]"
	cd sdk/python && ruff check . && ruff format --check src tests bench scripts && mypy && python3 scripts/unasync.py --check

SDK_PYTEST = ORCHARD_BIN=$(CURDIR)/target/debug/orchard python3 -m pytest sdk/python/tests

## sdk-test: only the Python SDK's tests, against a real `orchard serve`.
sdk-test: agent images sdk-deps
	cargo build -p orchard
	$(SDK_PYTEST)

## images: the test base images (busybox, empty, whiteout, python:3.11-slim) as OCI
## layouts in images/out/, built without Docker; cached (see images/README.md).
.PHONY: images
images: deps
	@images/build.sh

## harness: the harness bundle (codex, claude, opencode, pi, hermes) in images/out/harness,
## from the package registries, pinned and checked by images/harness/manifest.json; cached.
.PHONY: harness
harness:
	@images/harness/build.sh

## openapi: regenerate the committed OpenAPI documents after an intended API change.
openapi:
	UPDATE_OPENAPI=1 cargo test -p orchard-protocol openapi
	UPDATE_OPENAPI=1 cargo test -p orchard --lib openapi

## bench: the agent (exec latency against the fork/exec floor, sessions, git diff,
## streaming, RSS, size), the local backend (create/delete against `runc run`, a burst),
## the server, replicas over Redis, snapshots and forks, the SDK, scale (bench-scale) and
## the Kubernetes backend.
bench: agent images sdk-deps
	cargo build --release -p orchard
	cargo run --release -p orchard-bench -- --agent $(AGENT_BIN) --out bench/results
	ORCHARD_BENCH_OUT=$(CURDIR)/bench/results/backend.md \
	  cargo test --release -p orchard --test integration bench_local_backend -- --ignored --nocapture
	ORCHARD_BENCH_OUT=$(CURDIR)/bench/results/server.md cargo test --release -p orchard --test integration bench_server -- --ignored --nocapture
	ORCHARD_BENCH_OUT=$(CURDIR)/bench/results/replicas.md cargo test --release -p orchard --test integration bench_replicas -- --ignored --nocapture
	ORCHARD_BENCH_OUT=$(CURDIR)/bench/results/snapshots.md cargo test --release -p orchard --test integration bench_snapshots -- --ignored --nocapture
	ORCHARD_BENCH_OUT=$(CURDIR)/bench/results/hostile.md cargo test --release -p orchard --test integration bench_hostile -- --ignored --nocapture
	scripts/bench-sdk.sh
	$(MAKE) bench-scale
	@tests/k8s/bench.sh

## bench-scale: 1,000 sandboxes at once, 256 clients, creates next to `runc run`,
## exec throughput next to the agents and the spawn floor, latency with and without a
## CPU hog, a mixed load with its plot (bench/results/scale.md; docs/scale.md).
.PHONY: bench-scale
bench-scale: agent images
	cargo build --release -p orchard -p orchard-bench
	target/release/orchard-scale --orchard target/release/orchard --agent $(AGENT_BIN) \
	  --image-dir images/out/busybox --out bench/results

## chaos: three replicas on one data directory and Redis, one SIGKILLed every few dozen
## operations during 1,000 (tests/redis/chaos.rs), then the audit.
.PHONY: chaos
chaos: agent images
	cargo test -p orchard --test integration redis::chaos -- --nocapture

## run: start `orchard serve` in the background, create a python:3.11-slim sandbox, run
## a command in it, print the SANDBOX_BASE_URL / SANDBOX_API_KEY lines. `make run
## REPLICAS=3`: Redis and three replicas sharing it and one data directory.
run: agent images
	cargo build --release -p orchard
	@scripts/run.sh

## stop: stop what `make run` started and remove everything it made.
stop:
	@scripts/stop.sh

clean: stop
	cargo clean
