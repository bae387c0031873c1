#!/usr/bin/env python3
"""Checks the layout rules of the library crates (crates/*/src, code outside
test modules), so that they hold after the change that set them:

- no function over 80 lines, except those listed in LONG_ALLOWED with why;
- no source file over 700 lines (an inline `#[cfg(test)] mod` at the end of
  a file does not count);
- no import circle between the modules of a crate: at every level of the
  module tree, the sibling modules' `crate::` and `super::` imports form no
  cycle (a parent using its children does not count).

It reads the sources as text (no build), prints every breach and exits 1
when there is one. Run it as `make layout`; `.ci/run` runs it too.
"""

import os
import re
import sys

MAX_FN_LINES = 80
MAX_FILE_LINES = 700

# Functions allowed over MAX_FN_LINES, as "path::name": a table or a match
# that reads better whole. Say why beside each entry.
LONG_ALLOWED = {}

FN = re.compile(r"\s*(pub(\([^)]*\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)")
TEST_MOD = re.compile(r"\n#\[cfg\(test\)\]\s*\nmod \w+\s*\{")


def library_files(root):
    """Yields the non-test .rs files of every crate's src/."""
    for crate in sorted(os.listdir(root)):
        base = os.path.join(root, crate, "src")
        for folder, _, files in os.walk(base):
            for name in sorted(files):
                if not name.endswith(".rs") or name == "tests.rs" or name.endswith("_tests.rs"):
                    continue
                path = os.path.join(folder, name)
                if "tests" in os.path.relpath(path, base).split(os.sep)[:-1]:
                    continue
                yield crate, base, path


def code_of(path):
    """The file's text up to an inline test module at its end."""
    text = open(path, encoding="utf-8").read()
    cut = TEST_MOD.search(text)
    return text[: cut.start()] if cut else text


def without_literals(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return line.split("//")[0]


def long_functions(path, code):
    lines = code.split("\n")
    for start, line in enumerate(lines):
        found = FN.match(line)
        if not found:
            continue
        depth, opened = 0, False
        for end in range(start, len(lines)):
            text = without_literals(lines[end])
            if not opened and text.rstrip().endswith(";"):
                break
            for ch in text:
                if ch == "{":
                    depth, opened = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if opened and depth == 0:
                length = end - start + 1
                if length > MAX_FN_LINES:
                    yield start + 1, found.group(6), length
                break


def module_path(base, path):
    parts = os.path.relpath(path, base)[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def imports(module, code):
    """The module paths (tuples from the crate root) a file names."""
    code = re.sub(r"//.*", "", code)
    found = set()

    def add(prefix, inner):
        for part in inner.split(","):
            names = [n.strip("{} \n") for n in part.strip().split("::") if n.strip("{} \n")]
            if names:
                found.add(prefix + tuple(names))

    for m in re.finditer(r"crate::((?:\w+::)*\w+)", code):
        found.add(tuple(m.group(1).split("::")))
    for m in re.finditer(r"crate::((?:\w+::)*)\{([^;]*?)\};", code, re.S):
        add(tuple(n for n in m.group(1).split("::") if n), m.group(2))
    for m in re.finditer(r"\b((?:super::)+)((?:\w+::)*\w+)", code):
        up = m.group(1).count("super::")
        if up <= len(module):
            found.add(module[: len(module) - up] + tuple(m.group(2).split("::")))
    for m in re.finditer(r"\b((?:super::)+)((?:\w+::)*)\{([^;]*?)\};", code, re.S):
        up = m.group(1).count("super::")
        if up <= len(module):
            add(module[: len(module) - up] + tuple(n for n in m.group(2).split("::") if n), m.group(3))
    return found


def cycles(graph):
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def module_cycles(crate, files):
    """Cycles among sibling modules, at every level of one crate's tree."""
    parents = {m[:-1] for m in files if m}
    for parent in sorted(parents):
        depth = len(parent)
        children = {m[depth] for m in files if len(m) > depth and m[:depth] == parent}
        graph = {c: set() for c in children}
        for module, names in files.items():
            if len(module) <= depth or module[:depth] != parent:
                continue
            for name in names:
                if len(name) > depth and name[:depth] == parent and name[depth] in children:
                    if name[depth] != module[depth]:
                        graph[module[depth]].add(name[depth])
        for component in cycles(graph):
            edges = {a: sorted(graph[a] & set(component)) for a in component}
            yield f"{crate}: {'::'.join(parent) or 'crate root'}: {edges}"


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates")
    breaches = []
    per_crate = {}
    for crate, base, path in library_files(root):
        code = code_of(path)
        shown = os.path.relpath(path, os.path.join(root, ".."))
        lines = code.count("\n") + 1
        if lines > MAX_FILE_LINES:
            breaches.append(f"{shown}: {lines} lines (at most {MAX_FILE_LINES} outside tests)")
        for line, name, length in long_functions(path, code):
            if f"{shown}::{name}" not in LONG_ALLOWED:
                breaches.append(f"{shown}:{line}: fn {name} is {length} lines (at most {MAX_FN_LINES})")
        module = module_path(base, path)
        per_crate.setdefault(crate, {})[module] = imports(module, code)
    for crate, files in sorted(per_crate.items()):
        for cycle in module_cycles(crate, files):
            breaches.append(f"import circle in {cycle}")
    for breach in breaches:
        print(breach)
    if breaches:
        print(f"{len(breaches)} layout rule(s) broken: see .ci/layout.py for the rules")
        return 1
    print("layout: no long function, no long file, no import circle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
