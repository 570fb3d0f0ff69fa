"""The import map of docs/architecture.md, checked against the code: layers, no circles, the CLI on top.

Every ``import`` of a ``specdec_lab`` module counts, at module level or inside a function (a lazy
import still couples the two modules), parsed with :mod:`ast` (nothing is imported).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specdec_lab"

# Lowest first: a module may import modules of its own layer or of a lower one, never of a higher one.
# Keep in step with the table in docs/architecture.md (test_architecture_doc_lists_every_layer checks it).
LAYERS = {
    "foundations": ["specdec_lab", "sampling", "models", "theory", "stats.*", "plots.*", "serving", "drafting",
                    "verdicts", "results"],
    "samplers": ["samplers.*"],
    "laws": ["laws.*"],
    "engines": ["adapters.*", "patches.*"],
    "collection": ["collect"],
    "statistics": ["suite", "kernels.*", "testing"],
    "report": ["report.*"],
    "jobs": ["verify", "audit", "workload.*", "bench.*", "coverage_study", "training.*"],
    "front": ["cli.*", "experiments.*"],
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The specdec_lab modules ``name`` imports (``from specdec_lab import x`` counts x when x is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names}
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def layer_of(name: str) -> str:
    short = name.removeprefix("specdec_lab.") if name != "specdec_lab" else name
    for layer, patterns in LAYERS.items():
        for pattern in patterns:
            if short == pattern or (pattern.endswith(".*") and (short == pattern[:-2] or
                                                                 short.startswith(pattern[:-1]))):
                return layer
    raise AssertionError(f"{name} is in no layer of docs/architecture.md: add it to LAYERS and to the page")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_planted_circle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    assert cycles(graph()) == []


def test_nothing_imports_the_cli():
    offenders = sorted(name for name, targets in graph().items() if not name.startswith("specdec_lab.cli")
                       and any(t == "specdec_lab.cli" or t.startswith("specdec_lab.cli.") for t in targets))
    assert offenders == []


def test_every_module_in_a_layer_and_imports_only_downwards():
    order = list(LAYERS)
    upward = [(name, target, layer_of(name), layer_of(target)) for name, targets in graph().items()
              for target in sorted(targets) if order.index(layer_of(target)) > order.index(layer_of(name))]
    assert upward == []


def test_import_parser_sees_lazy_and_relative_imports(tmp_path):
    known = {"specdec_lab.cli", "specdec_lab.audit", "specdec_lab.samplers", "specdec_lab.samplers.rules"}
    source = tmp_path / "mod.py"
    source.write_text("def f():\n    from specdec_lab.cli import _load\n"
                      "from specdec_lab.samplers import rules\nimport specdec_lab.audit\n")
    assert imports_of("specdec_lab.x", source, known) == {"specdec_lab.cli", "specdec_lab.samplers.rules",
                                                          "specdec_lab.audit"}


def test_architecture_doc_lists_every_layer():
    page = (ROOT / "docs" / "architecture.md").read_text()
    for layer, patterns in LAYERS.items():
        assert f"**{layer}**" in page, f"docs/architecture.md does not name the layer {layer}"
        for pattern in patterns:
            assert f"`{pattern}`" in page, f"docs/architecture.md does not list `{pattern}` ({layer})"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", ["README.md", *sorted(p.relative_to(ROOT).as_posix()
                                                       for p in (ROOT / "docs").glob("*.md"))])
def test_relative_links_resolve(page):
    """Every relative link in the README and the docs/ pages names a file of the repository (and a heading of it)."""
    path = ROOT / page
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        file, _, anchor = target.partition("#")
        linked = path.parent / file if file else path
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
            broken.append(target)
    assert broken == []


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page's headings: lower case, punctuation dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in page.read_text().splitlines() if re.match(r"#{1,6} ", line)}
