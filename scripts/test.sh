#!/usr/bin/env bash
# The project's one test command (the README's and CI's): starts the servers
# scripts/services.sh lists (a file per server in scripts/services/) on loopback, installing
# them first when missing, exports their URLs, runs every test of the workspace against
# them, and stops them again, also on failure or Ctrl-C.
#
#   scripts/test.sh [extra `cargo test` arguments, e.g. -p dedup-postgres or -- claim_]
#
# The arguments go to the first `cargo test --workspace --all-targets --all-features` run; the doc tests
# always run in full afterwards. The exit code is the tests' (non-zero if either run failed).
#
# Before the tests it checks formatting, the toolchain against the MSRV, the backends'
# file layout against ARCHITECTURE.md (scripts/check-layout.sh), the docs' lengths, links
# and sentences (scripts/check-docs.sh) and that each backend
# feature compiles only its own driver (scripts/check-drivers.sh), and that no mutant of the
# state machine or the front door survives dedup-core's tests (scripts/check-mutants.sh); after them it
# runs clippy (warnings denied), rustdoc (warnings denied) and a build check of the examples and the bench
# with each backend feature alone, and clippy of dedup-brokers with no broker and with each
# broker feature alone, and of dedup-testkit with each backend feature alone. Any failure
# fails the run; every step still runs, and the summary at the end names the steps that
# failed.
#
# Environment:
#   DEDUP_CHECKS=0        skip fmt / MSRV / clippy / doc / feature checks (tests only)
#   PROPTEST_CASES        cases per property test (default 256)
#   DEDUP_SERVICES_DIR    where the servers keep their data (default: a fresh folder per run)
#   DEDUP_TEST_BINARY_LIMIT  seconds one test binary may run before it is killed and fails
#                         (default 900; scripts/test-binary.sh)
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$REPO_ROOT"

log() { printf '[test.sh] %s\n' "$*" >&2; }

# Seconds since a start time taken from $EPOCHREALTIME, e.g. "12.3".
elapsed_since() {
    local start_us=${1/./} now_us=${EPOCHREALTIME/./}
    local tenths=$(((now_us - start_us) / 100000))
    printf '%d.%d' $((tenths / 10)) $((tenths % 10))
}

if ! command -v cargo >/dev/null 2>&1; then
    log "error: cargo not found on PATH. Install Rust (https://rustup.rs) or add ~/.cargo/bin to PATH."
    exit 127
fi

# A state dir of its own per run (not the default one of `scripts/services.sh start`): the
# EXIT trap below stops everything in it, and must not stop servers a developer started by
# hand, nor those of a test run going on in parallel in the same checkout.
export DEDUP_SERVICES_DIR=${DEDUP_SERVICES_DIR:-/tmp/dedup-test-$(printf '%s' "$REPO_ROOT" | sha1sum | cut -c1-8)-$$}

# shellcheck disable=SC2317 # called by the EXIT trap
stop_services() {
    local t=$EPOCHREALTIME
    scripts/services.sh stop || log "warning: stopping the services failed; see $DEDUP_SERVICES_DIR"
    log "services stopped in $(elapsed_since "$t")s"
}
trap stop_services EXIT
# Turn signals into a normal exit so the EXIT trap runs (130/143: the usual codes).
trap 'exit 130' INT
trap 'exit 143' TERM

# A clean build and the servers' data take about 10 GB; a full disk shows up later as a
# linker's bus error or "No space left on device" in the middle of the build. Say so first.
check_disk() {
    local target=${CARGO_TARGET_DIR:-$REPO_ROOT/target} dir free_kb
    for dir in "$target" "$(dirname "$DEDUP_SERVICES_DIR")"; do
        while [[ ! -d $dir ]]; do dir=$(dirname "$dir"); done
        free_kb=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
        if ((free_kb < 10 * 1024 * 1024)); then
            log "warning: $((free_kb / 1024)) MiB free on the disk holding $dir; a clean run needs about 10 GiB"
        fi
    done
}
check_disk

t=$EPOCHREALTIME
scripts/services.sh start
eval "$(scripts/services.sh env)"
# The console's browser tests (console/tests/browser.rs) need Chromium and ChromeDriver.
scripts/services.sh install-browser
log "services started in $(elapsed_since "$t")s"

# Strict: a test that needs a server and finds no URL fails instead of skipping.
export DEDUP_TEST_STRICT=1
export PROPTEST_CASES=${PROPTEST_CASES:-256}

failed=()
# Run one named step, timing it; a failure is recorded, not fatal.
step() {
    local name=$1 t=$EPOCHREALTIME rc=0
    shift
    log "$name: $*"
    "$@" || rc=$?
    log "$name finished in $(elapsed_since "$t")s (exit $rc)"
    ((rc == 0)) || failed+=("$name")
}

# The toolchain must be at least the workspace's rust-version (the MSRV we build with).
check_msrv() {
    local msrv have
    msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
    have=$(rustc --version | awk '{print $2}')
    if [[ $(printf '%s\n%s\n' "$msrv" "$have" | sort -V | head -n1) != "$msrv" ]]; then
        log "error: rustc $have is older than the MSRV $msrv (Cargo.toml rust-version)"
        return 1
    fi
    log "rustc $have, MSRV $msrv"
}

checks=${DEDUP_CHECKS:-1}
if [[ $checks != 0 ]]; then
    step msrv check_msrv
    step fmt cargo fmt --all --check
    step layout scripts/check-layout.sh
    step docs scripts/check-docs.sh
    step drivers scripts/check-drivers.sh
    # Mutants of the state machine and the front door must each fail a test (a few minutes).
    step mutants scripts/check-mutants.sh
fi

# Each test binary runs under a time limit (scripts/test-binary.sh as cargo's runner): a
# test that hangs fails its binary, named in the log, and the rest of the run goes on.
host=$(rustc -vV | sed -n 's/^host: //p')
runner_var=CARGO_TARGET_$(printf '%s' "$host" | tr 'a-z.-' 'A-Z__')_RUNNER
export "$runner_var=$REPO_ROOT/scripts/test-binary.sh"

# --all-features: the examples crate's default builds only the main demo (a lean first
# `cargo run`); the tests build and run every program, backend and TLS.
step "cargo test" cargo test --workspace --all-targets --all-features --no-fail-fast "$@"
# A server that died mid-run explains the failures it caused: show which, and its log.
if [[ " ${failed[*]} " == *" cargo test "* ]]; then scripts/services.sh report || true; fi
step "doc tests" cargo test --workspace --all-features --doc

if [[ $checks != 0 ]]; then
    step clippy cargo clippy --workspace --all-targets --all-features -- -D warnings
    step rustdoc env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps
    for feature in sqlite postgres redis mysql; do
        step "examples with only $feature" \
            cargo check -p dedup-examples --bins --no-default-features --features "$feature"
        step "bench with only $feature" \
            cargo check -p dedup-bench --no-default-features --features "$feature"
        step "dedup with only $feature" \
            cargo check -p dedup --no-default-features --features "$feature"
    done
    step "dedup with only nats-kv" cargo check -p dedup --no-default-features --features nats-kv
    step "dedup with no backend" cargo check -p dedup --no-default-features
    # The chaos runs' queue is PostgreSQL: their smallest build has no other backend.
    step "chaos with only postgres" cargo check -p dedup-chaos --no-default-features
    # The broker adapters: clippy of the one crate with no broker and with each alone, so
    # code only one broker uses is gated by its feature, not left dead in the others.
    step "dedup-brokers with no broker" \
        cargo clippy -p dedup-brokers --all-targets --no-default-features -- -D warnings
    for feature in rabbitmq redis-streams nats kafka pubsub; do
        step "dedup-brokers with only $feature" \
            cargo clippy -p dedup-brokers --all-targets --no-default-features --features "$feature" -- -D warnings
    done
    # The test kit: clippy with each backend feature alone (a user's build enables one).
    for feature in sqlite postgres mysql; do
        step "dedup-testkit with only $feature" \
            cargo clippy -p dedup-testkit --all-targets --no-default-features --features "$feature" -- -D warnings
    done
fi

if ((${#failed[@]})); then
    log "FAILED: ${failed[*]}"
    exit 1
fi
log "all steps passed"
