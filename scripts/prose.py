#!/usr/bin/env python3
"""Words per sentence of Markdown prose.

    scripts/prose.py FILE.md...            # a line per file: sentences, words, average, share over 40
    scripts/prose.py --max-average 20 FILE.md...   # also exit 1 when a file's average is above 20

Only prose counts: code blocks, tables, headings and HTML comments are left out. Inline
code and a link's address count as one word. A sentence ends at `.`, `!` or `?` followed
by a space, and at the end of a paragraph or list item. Common abbreviations (`e.g.`,
`i.e.`, `etc.`, `vs.`) do not end one.
"""

import re
import sys

ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.")


def blocks(text):
    """The prose blocks of a Markdown text: paragraphs and list items, one string each."""
    out, current, in_code = [], [], False
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            in_code = not in_code
            if current:
                out.append(" ".join(current))
                current = []
            continue
        if in_code:
            continue
        if (
            not stripped
            or stripped.startswith("|")
            or stripped.startswith("#")
            or line.startswith("    ")
            and not current
        ):
            if current:
                out.append(" ".join(current))
                current = []
            continue
        if re.match(r"^([-*+]|\d+\.)\s", stripped) and current:
            out.append(" ".join(current))
            current = []
        current.append(re.sub(r"^([-*+]|\d+\.)\s+", "", stripped))
    if current:
        out.append(" ".join(current))
    return out


def sentences(block):
    """The sentences of one prose block."""
    block = re.sub(r"`[^`]*`", "CODE", block)
    block = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", block)
    for abbreviation in ABBREVIATIONS:
        block = block.replace(abbreviation, abbreviation.replace(".", ""))
    parts = re.split(r"(?<=[.!?])[\"')\]*]*\s+", block)
    return [p for p in parts if words(p)]


def words(sentence):
    """The words of a sentence: tokens holding a letter or a digit."""
    return [w for w in sentence.split() if re.search(r"[A-Za-z0-9]", w)]


def measure(path):
    """(sentences, words, share of sentences over 40 words) of one file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    counts = [len(words(s)) for b in blocks(text) for s in sentences(b)]
    if not counts:
        return 0, 0, 0.0
    long = sum(1 for c in counts if c > 40)
    return len(counts), sum(counts), long / len(counts)


def main(argv):
    limit = None
    if argv[:1] == ["--max-average"]:
        limit, argv = float(argv[1]), argv[2:]
    status = 0
    for path in argv:
        n, w, long = measure(path)
        average = w / n if n else 0.0
        print(f"{path}: {n} sentences, {w} words, {average:.1f} words per sentence, {long:.0%} over 40")
        if limit is not None and average > limit:
            print(f"prose: {path} averages {average:.1f} words per sentence, over {limit:g}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
