#!/usr/bin/env python3
"""Finds import circles between the modules of one crate: module A names module B (through
`crate::`, `super::` or `self::` paths, in `use` items or inline) while B, directly or through
others, names A. A module naming its own parent or ancestors is not counted: a parent owns
its children, and children reach shared items through it.

Usage: scripts/import-circles.py CRATE_SRC_DIR...

Prints each circle with the imports that close it and exits with status 1 when there is one.
Test modules (`#[cfg(test)] mod tests` and everything after it) and comments are skipped.
"""
import os
import re
import sys

PATH = re.compile(r"\b(crate|super|self)((?:::\w+)+)(?:::\{([^}]*)\})?")


def modules(root):
    """Module path (a tuple of names) to source file, for every .rs file under root."""
    found = {}
    for directory, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(directory, name)
            parts = os.path.relpath(path, root)[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            found[tuple(parts)] = path
    return found


def imports(module, path, known):
    """The modules `module` names, other than itself and its ancestors."""
    text = open(path, encoding="utf-8").read()
    tests = re.search(r"#\[cfg\(test\)\]\s*mod tests", text)
    if tests:
        text = text[: tests.start()]
    text = re.sub(r"//.*", "", text)
    named = set()
    for match in PATH.finditer(text):
        base, rest, group = match.group(1), match.group(2), match.group(3)
        parts = [part for part in rest.split("::") if part]
        if base == "crate":
            start = []
        elif base == "self":
            start = list(module)
        else:
            start = list(module[:-1])
            while parts and parts[0] == "super":
                parts, start = parts[1:], start[:-1]
        paths = [start + parts]
        for item in (group or "").split(","):
            item = item.strip().split(" as ")[0].split("::")
            if item[0] and item[0] != "self":
                paths.append(start + parts + item)
        for candidate in paths:
            for length in range(len(candidate), 0, -1):
                target = tuple(candidate[:length])
                if target in known:
                    if target != module and module[: len(target)] != target:
                        named.add(target)
                    break
    return named


def circles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    failed = False
    for root in sys.argv[1:]:
        known = modules(root)
        edges = {module: imports(module, path, known) for module, path in known.items()}
        for component in circles(edges):
            failed = True
            names = ", ".join("::".join(module) for module in component)
            print(f"{root}: import circle among {names}:")
            for module in component:
                for target in sorted(edges[module]):
                    if target in component:
                        print(f"    {'::'.join(module)} imports {'::'.join(target)}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
