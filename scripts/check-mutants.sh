#!/usr/bin/env bash
# The mutation guard: cargo-mutants changes the state machine (core/src/backend/transition.rs)
# and the front door (core/src/backend/front_door.rs) one function or operator at a time,
# and each change must fail a test of dedup-core. Run by scripts/test.sh; exits non-zero
# when a mutant survives (cargo-mutants exits 2 then, 3 on a timeout, 4 if the tests fail
# unmutated), naming it.
#
#   scripts/check-mutants.sh [extra cargo-mutants arguments, e.g. -F forget to test only
#                             the mutants whose name matches]
#
# Mutants that cannot change behaviour are excluded in .cargo/mutants.toml, each with its
# reason; core/tests/MUTANTS.md lists them and gives the command of the full run.
#
# It installs cargo-mutants (crates.io) when the right version is missing: a few minutes,
# once. It builds a copy of the tree in a temporary folder, never the tree itself, so it
# is safe beside an editor or a build in progress.
#
# Environment:
#   DEDUP_MUTANTS_JOBS  builds in parallel (default 2)
#   DEDUP_MUTANTS_OUT   where mutants.out is written (default target/mutants-guard)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION=27.1.0

if [[ $(cargo mutants --version 2>/dev/null) != "cargo-mutants $VERSION" ]]; then
    echo "check-mutants: installing cargo-mutants $VERSION" >&2
    cargo install --locked "cargo-mutants@$VERSION"
fi

# Every mutant rebuilds dedup-core in the same build folder: incremental compilation pays
# there, also in CI (.ci/run turns it off for the one clean build of everything else).
export CARGO_INCREMENTAL=1

# cargo-mutants writes mutants.out into this folder, and creates it but not its parent
# (a fresh clone has no target/ yet).
out=${DEDUP_MUTANTS_OUT:-target/mutants-guard}
mkdir -p "$(dirname "$out")"

# Only the test binaries that pin these two files: the other binaries of dedup-core take
# longer to build than to run, and every mutant builds them again. `--cargo-arg` (not
# `--cargo-test-arg`) so the selection also holds for the build (`cargo test --no-run`):
# with `--cargo-test-arg` every mutant built all of dedup-core's test binaries and only
# ran these (7 mutants: 112 s against 54 s).
exec cargo mutants \
    --package dedup-core \
    --file core/src/backend/transition.rs \
    --file core/src/backend/front_door.rs \
    --test-package dedup-core \
    --cargo-arg=--test=transition \
    --cargo-arg=--test=front_door \
    --cargo-arg=--test=memory_store \
    --jobs "${DEDUP_MUTANTS_JOBS:-2}" \
    --output "$out" \
    --no-shuffle \
    "$@"
