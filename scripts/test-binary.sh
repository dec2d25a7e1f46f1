#!/usr/bin/env bash
# Cargo's runner for the test executables of scripts/test.sh: runs one test binary with a
# time limit, so a test that hangs fails its own binary instead of stalling the whole run
# (the other binaries still run: `cargo test --no-fail-fast`). libtest names the test that
# hung above, in its "has been running for over 60 seconds" line.
#
#   scripts/test-binary.sh TEST_BINARY [ARGS...]
#
# Environment:
#   DEDUP_TEST_BINARY_LIMIT   seconds one test binary may run (default 900; the slowest
#                             takes about 70 s on a 2-core machine)
set -uo pipefail

limit=${DEDUP_TEST_BINARY_LIMIT:-900}
# --foreground: the binary stays in the terminal's process group, so Ctrl-C still reaches it.
timeout --foreground -k 30 "$limit" "$@"
rc=$?
if ((rc == 124 || rc == 137)); then
    printf '[test.sh] error: %s killed after %s s: a test in it hung (named above: "has been running for over 60 seconds")\n' \
        "${1##*/}" "$limit" >&2
fi
exit "$rc"
