#!/usr/bin/env python3
"""Lists the longest functions in crates/*/src (issue 22: none over 120 lines).

Usage: scripts/longest-functions.py [N]   (default 12; run from the repository root)

Counts lines from a function's `fn` line to its closing brace, reading the text (string and char
literals and line comments are skipped when braces are counted). Exits 1 when one is over 120 lines.
"""

import glob
import re
import sys

LIMIT = 120
FN = re.compile(r"\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")


def functions(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = FN.match(lines[i])
        if not m:
            i += 1
            continue
        j, depth, started = i, 0, False
        while j < len(lines):
            line = re.sub(r'"(\\.|[^"\\])*"', '""', lines[j])
            line = re.sub(r"'(\\.|[^'\\])'", "''", line).split("//")[0]
            for ch in line:
                if ch == "{":
                    depth, started = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if started and depth == 0:
                break
            if not started and line.rstrip().endswith(";"):
                break
            j += 1
        if started:
            yield (j - i + 1, path, i + 1, m.group(6))
            i = j + 1
        else:
            i += 1


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    found = sorted(
        (f for p in glob.glob("crates/*/src/**/*.rs", recursive=True) for f in functions(p)), reverse=True
    )
    for lines, path, line, name in found[:n]:
        print(f"{lines:5} lines  {path}:{line}  {name}")
    return 1 if found and found[0][0] > LIMIT else 0


if __name__ == "__main__":
    sys.exit(main())
