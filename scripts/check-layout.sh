#!/usr/bin/env bash
# Check that the job -> file tables match the tree. Run by scripts/test.sh; exits non-zero
# and names each file that differs.
#
# Two tables, each the one whose header row starts with `| job |`:
#   - ARCHITECTURE.md's covers the backend crates: one column per folder under backends/,
#     compared with backends/<name>/src/.
#   - brokers/README.md's covers the broker folders: one column per folder of
#     brokers/src/ (one holding only a module's `tests.rs` is not a broker), compared with
#     brokers/src/<name>/. Every row but the last (the broker's own jobs) names a file in
#     every column: each broker folder has the common files.
#
# A cell names files in backticks, `x.rs` or a folder module `x/` (several allowed; other
# words and backticked text are commentary), or `-` when there is no such job. Every file a
# table names exists, every file or folder in a covered folder is named, and every folder
# has a column.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

status=0
fail() {
    echo "check-layout: $*" >&2
    status=1
}

# check <doc> <root> <what> <common> <folder>...: compare <doc>'s table with <root>/<col><src>
# for each column. <common>: 1 when every row but the last must name a file in every column.
# <folder>...: the folders that must each have a column.
check() {
    local doc=$1 root=$2 src=$3 common=$4
    shift 4
    local table
    table=$(awk '/^\| job \|/ {on=1} on && /^\|/ {print; next} on {exit}' "$doc")
    if [[ -z $table ]]; then
        fail "no '| job |' table in $doc"
        return
    fi
    local -a header columns
    IFS='|' read -r -a header <<<"$(head -n1 <<<"$table")"
    local cell name
    for cell in "${header[@]:2}"; do
        name=$(tr -d ' `' <<<"$cell")
        [[ -n $name ]] && columns+=("$name")
    done
    local folder
    for folder in "$@"; do
        if [[ ! " ${columns[*]} " == *" $folder "* ]]; then
            fail "$root/$folder has no column in $doc's job -> file table"
        fi
    done
    local body rows i dir row file path entry before=$status
    body=$(tail -n +3 <<<"$table")
    rows=$(wc -l <<<"$body")
    local -A named=()
    for i in "${!columns[@]}"; do
        dir=$root/${columns[$i]}$src
        if [[ ! -d $dir ]]; then
            fail "$doc's job -> file table names $dir, which does not exist"
            continue
        fi
        local n=0
        while IFS= read -r row; do
            n=$((n + 1))
            IFS='|' read -r -a cells <<<"$row"
            cell=${cells[$((i + 2))]:-}
            local files
            files=$(grep -oE '`[A-Za-z0-9_]+(\.rs|/)`' <<<"$cell" | tr -d '`' || true)
            if ((common)) && ((n < rows)) && [[ -z $files ]]; then
                fail "$dir has no file for '$(cut -d'|' -f2 <<<"$row" | xargs)' ($doc's job -> file table)"
            fi
            for file in $files; do
                named["$dir/$file"]=1
                [[ -e $dir/${file%/} ]] ||
                    fail "$doc names $dir/$file, which does not exist"
            done
        done <<<"$body"
        for path in "$dir"/*; do
            entry=${path##*/}
            [[ -d $path ]] && entry="$entry/"
            [[ -n ${named["$dir/$entry"]:-} ]] ||
                fail "$dir/$entry is not in $doc's job -> file table"
        done
    done
    ((status != before)) ||
        echo "check-layout: $doc's job -> file table matches $root/{$(IFS=,; echo "${columns[*]}")}$src"
}

backends=()
for dir in backends/*/; do
    [[ -d $dir/src ]] && backends+=("$(basename "$dir")")
done
check ARCHITECTURE.md backends /src 0 "${backends[@]}"

brokers=()
for dir in brokers/src/*/; do
    # A folder holding only `tests.rs` is a module's unit tests, not a broker.
    [[ $(find "$dir" -mindepth 1 -not -name tests.rs | head -n1) ]] &&
        brokers+=("$(basename "$dir")")
done
check brokers/README.md brokers/src "" 1 "${brokers[@]}"

exit $status
