#!/usr/bin/env python3
"""Check that every relative link in the repository's Markdown files resolves.

    scripts/check_links.py [ROOT]

A link `[text](path)` or `[text](path#anchor)` must name a file or folder that exists,
relative to the Markdown file. An anchor into a Markdown file must match one of its
headings (GitHub's rule: lower case, punctuation dropped, spaces as dashes). Links to
other sites (`http:`, `https:`, `mailto:`) and rustdoc paths (`dedup_core::Lease`) are not
checked. Code blocks and inline code
are skipped. Exits 1 and names each broken link.
"""

import os
import re
import sys

SKIP_DIRS = {".git", "target", "node_modules"}
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^()\s]+(?:\([^()\s]*\))?)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"\!\[[^\]]*\]\(([^()\s]+)\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s+(\S+)", re.M)


def markdown_files(root):
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".md"):
                yield os.path.join(folder, name)


def prose(text):
    """The text without fenced code blocks and inline code."""
    text = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading):
    heading = re.sub(r"`", "", heading.strip().lower())
    heading = re.sub(r"[^\w\- ]", "", heading)
    return heading.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        with open(path, encoding="utf-8") as f:
            text = re.sub(r"^\s*```.*?^\s*```", "", f.read(), flags=re.S | re.M)
        seen, found = {}, set()
        for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M):
            s = slug(heading)
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
        cache[path] = found
    return cache[path]


def broken_links(path):
    with open(path, encoding="utf-8") as f:
        text = prose(f.read())
    targets = LINK.findall(text) + IMAGE.findall(text) + REFERENCE.findall(text)
    for target in targets:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or "::" in target:
            continue  # another site, or a rustdoc path (a crate README is its crate's docs)
        file_part, _, anchor = target.partition("#")
        resolved = path if not file_part else os.path.normpath(os.path.join(os.path.dirname(path), file_part))
        if not os.path.exists(resolved):
            yield target, "no such file"
        elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            yield target, f"no heading '#{anchor}' in {resolved}"


def main(argv):
    root = argv[0] if argv else "."
    status, checked = 0, 0
    for path in markdown_files(root):
        checked += 1
        for target, why in broken_links(path):
            print(f"check-links: {os.path.relpath(path, root)}: ({target}): {why}", file=sys.stderr)
            status = 1
    if status == 0:
        print(f"check-links: every relative link in {checked} Markdown files resolves")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
