#!/usr/bin/env bash
# Check that each backend feature compiles only its own database driver: `cargo tree` of
# `dedup` and `dedup-testkit` with one backend feature on must hold that backend's driver
# crate and none of the others'. Run by scripts/test.sh; exits non-zero naming the extra
# drivers. Needs no build (it reads the resolved graph).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# backend feature -> the driver crate it brings.
declare -A DRIVER=(
    [sqlite]=rusqlite
    [postgres]=sqlx-postgres
    [mysql]=sqlx-mysql
    [redis]=redis
    [nats-kv]=async-nats
)

status=0
# check PACKAGE FEATURE: the normal dependencies of PACKAGE built with FEATURE alone.
check() {
    local package=$1 feature=$2 tree other
    tree=$(cargo tree -q -p "$package" --no-default-features --features "$feature" \
        -e normal --prefix none --format '{p}' | awk '{print $1}' | sort -u)
    if ! grep -qx "${DRIVER[$feature]}" <<<"$tree"; then
        echo "check-drivers: $package with only '$feature' lacks its driver ${DRIVER[$feature]}" >&2
        status=1
    fi
    for other in "${!DRIVER[@]}"; do
        [[ $other == "$feature" ]] && continue
        if grep -qx "${DRIVER[$other]}" <<<"$tree"; then
            echo "check-drivers: $package with only '$feature' also compiles ${DRIVER[$other]} ('$other''s driver):" >&2
            cargo tree -q -p "$package" --no-default-features --features "$feature" -e normal \
                -i "${DRIVER[$other]}" >&2 || true
            status=1
        fi
    done
}

for feature in sqlite postgres mysql redis nats-kv; do
    check dedup "$feature"
done
for feature in sqlite postgres mysql; do
    check dedup-testkit "$feature"
done
if ((status == 0)); then
    echo "check-drivers: dedup and dedup-testkit compile one driver per backend feature"
fi
exit $status
