#!/usr/bin/env python3
"""make check-deps: every #include of the sources against the layer rules of docs/ARCHITECTURE.md.

The rules are the table under "## Who may include whom" in that file, so the document and the
check cannot drift apart: each row names folders (or train_gpt.c) and what their files may
include, as folders ("model"), single headers ("common/check.h") or "everything"; a header
listed under "never" is refused even when its folder is allowed. A project include must be
written from the repository root ("data/shard.h", not "shard.h"). Exits 1 naming each broken
include, 0 with one summary line otherwise; 2 when the table itself cannot be read.
"""
import os
import re
import subprocess
import sys

# The repository to check: this script's own, or the one named by --root DIR (the tests use a copy).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if len(sys.argv) == 3 and sys.argv[1] == "--root":
    ROOT = os.path.abspath(sys.argv[2])
elif len(sys.argv) != 1:
    print("usage: scripts/check_deps.py [--root DIR]", file=sys.stderr)
    sys.exit(2)
DOC = os.path.join("docs", "ARCHITECTURE.md")
SOURCES = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def names(cell):
    """The backquoted or comma-separated names of a table cell, without trailing slashes."""
    items = re.findall(r"`([^`]+)`", cell) or [x.strip() for x in cell.split(",")]
    return [x.strip().rstrip("/") for x in items if x.strip()]


def read_rules():
    """{unit: (allowed, never)} from the rules table; a unit is a folder or a top-level file."""
    try:
        text = open(os.path.join(ROOT, DOC), encoding="utf-8").read()
    except OSError as e:
        print(f"check-deps: cannot read {DOC}: {e.strerror}", file=sys.stderr)
        sys.exit(2)
    m = re.search(r"^## Who may include whom\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not m:
        print(f"check-deps: {DOC} has no '## Who may include whom' section", file=sys.stderr)
        sys.exit(2)
    rules = {}
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not line.lstrip().startswith("|") or set(cells[0]) <= set("-: "):
            continue
        if cells[0].lower() == "files":
            continue
        allowed, never = names(cells[1]), names(cells[2]) if cells[2] not in ("", "-") else []
        for unit in names(cells[0]):
            rules[unit] = (allowed, never)
    if not rules:
        print(f"check-deps: the table of {DOC} has no rows", file=sys.stderr)
        sys.exit(2)
    return rules


def unit_of(path, rules):
    """The rule that governs a file: its own name, else its folder, else the nearest parent."""
    if path in rules:
        return path
    d = os.path.dirname(path)
    while d:
        if d in rules:
            return d
        d = os.path.dirname(d)
    return None


def permits(allowed, never, unit, inc):
    if inc in never or any(inc.startswith(n + "/") for n in never):
        return False
    if "everything" in allowed:
        return True
    folder = os.path.dirname(inc)
    return any(inc == a or folder == a for a in allowed + [unit])


def main():
    rules = read_rules()
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    broken, checked = [], 0
    for path in files:
        if not path.endswith(SOURCES) or path.startswith("tests/"):
            continue
        unit = unit_of(path, rules)
        if unit is None:
            broken.append(f"{path}: no row of {DOC} covers this file")
            continue
        allowed, never = rules[unit]
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                checked += 1
                if not os.path.exists(os.path.join(ROOT, inc)):
                    broken.append(f"{path}:{n}: \"{inc}\" is not a path from the repository root")
                elif not permits(allowed, never, unit, inc):
                    broken.append(f"{path}:{n}: {unit} may not include \"{inc}\" ({DOC})")
    for b in broken:
        print(f"check-deps: {b}", file=sys.stderr)
    if broken:
        print(f"check-deps: {len(broken)} broken include(s)", file=sys.stderr)
        return 1
    print(f"check-deps: {checked} includes follow {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
