#!/usr/bin/env bash
# Check the top-level docs: run by scripts/test.sh beside the layout check. It fails when
#   - README.md is over 350 lines, ARCHITECTURE.md or BENCHMARKS.md over 300;
#   - a relative link in any Markdown file of the repository points to a missing file or
#     heading (scripts/check_links.py);
#   - README.md or a page of docs/ averages over 20 words per sentence (scripts/prose.py);
#   - README.md's first Rust block is not examples/src/bin/quickstart.rs (the program
#     without its leading `//!` lines), so the README's first example is what compiles.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

status=0
fail() {
    echo "check-docs: $*" >&2
    status=1
}

for limit in README.md:350 ARCHITECTURE.md:300 BENCHMARKS.md:300; do
    file=${limit%%:*} max=${limit##*:}
    lines=$(wc -l <"$file")
    ((lines <= max)) || fail "$file has $lines lines, over $max"
done

python3 scripts/check_links.py . || status=1
python3 scripts/prose.py --max-average 20 README.md docs/*.md >/dev/null || status=1

readme_example=$(awk '/^```rust/ {on=1; next} on && /^```/ {exit} on {print}' README.md)
program=$(grep -v '^//!' examples/src/bin/quickstart.rs)
[[ $readme_example == "$program" ]] ||
    fail "README.md's first Rust block differs from examples/src/bin/quickstart.rs"

if ((status == 0)); then
    echo "check-docs: line limits, links, words per sentence and the README's example hold"
fi
exit $status
