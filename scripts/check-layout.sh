#!/usr/bin/env bash
# Check that ARCHITECTURE.md's "job -> file" table of the backend crates matches the tree:
# every file the table names exists in that backend's src/ (a file `x.rs`, or a folder
# module `x/` written as `x/`), and every file or folder in a backend's src/ is named in
# the table. Run by scripts/test.sh; exits non-zero with the differences.
#
# The table is the one whose header row starts with `| job |`; its other header cells
# are backend folder names under backends/ (sqlite, postgres, redis, ...). A cell names
# files in backticks, `x.rs` or a folder module `x/` (several allowed; other words and
# backticked text are commentary), or `-` when the backend has no such job.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

table=$(awk '/^\| job \|/ {on=1} on && /^\|/ {print; next} on {exit}' ARCHITECTURE.md)
if [[ -z $table ]]; then
    echo "check-layout: no '| job |' table in ARCHITECTURE.md" >&2
    exit 1
fi

# Header cells -> backend names.
IFS='|' read -r -a header <<<"$(head -n1 <<<"$table")"
backends=()
for cell in "${header[@]:2}"; do
    name=$(tr -d ' `' <<<"$cell")
    [[ -n $name ]] && backends+=("$name")
done

status=0
declare -A named
for i in "${!backends[@]}"; do
    b=${backends[$i]}
    if [[ ! -d backends/$b/src ]]; then
        echo "check-layout: the table names backend '$b', but backends/$b/src does not exist" >&2
        status=1
        continue
    fi
    # Column i+2 of every body row (skip the header and the |---| line).
    while IFS= read -r row; do
        IFS='|' read -r -a cells <<<"$row"
        cell=${cells[$((i + 2))]:-}
        for file in $(grep -oE '`[A-Za-z0-9_]+(\.rs|/)`' <<<"$cell" | tr -d '`'); do
            named["$b/$file"]=1
            if [[ ! -e backends/$b/src/${file%/} ]]; then
                echo "check-layout: ARCHITECTURE.md names backends/$b/src/$file, which does not exist" >&2
                status=1
            fi
        done
    done < <(tail -n +3 <<<"$table")
    # Every file / folder in src/ is named.
    for path in backends/"$b"/src/*; do
        entry=${path##*/}
        [[ -d $path ]] && entry="$entry/"
        if [[ -z ${named["$b/$entry"]:-} ]]; then
            echo "check-layout: backends/$b/src/$entry is not in ARCHITECTURE.md's job -> file table" >&2
            status=1
        fi
    done
done
if ((status == 0)); then
    echo "check-layout: ARCHITECTURE.md's job -> file table matches backends/{$(IFS=,; echo "${backends[*]}")}/src"
fi
exit $status
