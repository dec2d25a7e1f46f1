#!/usr/bin/env bash
# The project's one test command (the README's and CI's): starts PostgreSQL, Redis, Redis
# Cluster and RabbitMQ on loopback (installing them first when missing), runs every test of
# the workspace against them, and stops them again, also on failure or Ctrl-C.
#
#   scripts/test.sh [extra `cargo test` arguments, e.g. -p dedup-postgres or -- claim_]
#
# The arguments go to the first `cargo test --workspace --all-targets` run; the doc tests
# always run in full afterwards. The exit code is the tests' (non-zero if either run failed).
#
# Environment:
#   PROPTEST_CASES        cases per property test (default 256)
#   DEDUP_SERVICES_DIR    where the servers keep their data (default: a fresh folder per run)
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

t=$EPOCHREALTIME
scripts/services.sh start
eval "$(scripts/services.sh env)"
log "services started in $(elapsed_since "$t")s"

# Strict: a test that needs a server and finds no URL fails instead of skipping.
export DEDUP_TEST_STRICT=1
export PROPTEST_CASES=${PROPTEST_CASES:-256}

status=0
t=$EPOCHREALTIME
# `|| status=$?` keeps `set -e` from exiting before the doc tests and the timing line.
cargo test --workspace --all-targets "$@" || status=$?
log "cargo test --all-targets finished in $(elapsed_since "$t")s (exit $status)"

t=$EPOCHREALTIME
doc_status=0
cargo test --workspace --doc || doc_status=$?
log "cargo test --doc finished in $(elapsed_since "$t")s (exit $doc_status)"

((status != 0)) || status=$doc_status
exit "$status"
