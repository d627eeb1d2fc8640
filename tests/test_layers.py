"""Layers that only point down (docs/architecture.md, "Layers"): the run log, the tracer and
the probes know nothing of the detectors; the detectors nothing of what shows them; the
views nothing of the screen, the HTTP server or the collector that hand them their data.

Every module of the distribution is read as text (nothing is imported): each import
statement, at the top of a module, inside a function or under TYPE_CHECKING, relative or
absolute, is an edge. A module belongs to the most specific unit of LAYERS that names it.
A unit imports its own layer and the layers before it, never one after; and no two units
import each other, directly or around a loop. A new package or top-level module has to
be placed in LAYERS before this passes."""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the source roots and the names they install as (pyproject.toml's package-dir)
SOURCES = {"distdoctor": "distdoctor", "distdoctor.probes": "probes",
           "distdoctor.tui": "tui", "distdoctor.reference_trainer": "reference_trainer"}

# Lowest first. A unit is a package, or a module where it sits apart from its package.
LAYERS = (
    ("base", (  # no import of distdoctor at all
        "distdoctor.errors", "distdoctor.priority", "distdoctor.console",
        "distdoctor.plugins", "distdoctor.exits",
        "distdoctor.safetext",  # foreign text made safe to print
        "distdoctor.privatefiles",  # state files under shared dirs: private, no links
        "distdoctor.termination")),  # SIGTERM ends a command through its cleanup
    ("run log", (
        # with its C extension (runlog/_fast.c): self-contained, it imports nothing; the
        # run log's slot writer uses its SlotWriter as the tracer uses its Core
        "distdoctor.runlog",)),
    ("sensors", (  # what runs beside the job and writes what the detectors read
        "distdoctor.tracer", "distdoctor.spans", "distdoctor.probes",
        "distdoctor",  # the package itself: the Python API (install, trace), nothing below
    )),
    ("detectors", (
        "distdoctor.findings",  # what every detector produces and every front end shows
        "distdoctor.logs",  # the log reader: findings from a job's output
        "distdoctor.diagnosis")),  # the engine over the event logs, its drivers
    ("views", ("distdoctor.views",)),
    ("front ends", (
        "distdoctor.cli", "distdoctor.__main__", "distdoctor.tui", "distdoctor.export",
        "distdoctor.collect", "distdoctor.launch", "distdoctor.check", "distdoctor.nccltest",
        "distdoctor.reference_trainer")),
)
LAYER_OF = {unit: i for i, (_, units) in enumerate(LAYERS) for unit in units}
NAME_OF = {unit: LAYERS[i][0] for unit, i in LAYER_OF.items()}


def _modules() -> dict[str, tuple[Path | None, bool]]:
    """module name -> (its source file, or None for a C extension; is it a package)."""
    out: dict[str, tuple[Path | None, bool]] = {}
    for name, where in SOURCES.items():
        top = ROOT / where
        for path in sorted(top.rglob("*.py")):
            rel = path.relative_to(top).with_suffix("").parts
            if any(p.startswith(".") or p == "__pycache__" for p in rel):
                continue
            package = rel[-1] == "__init__"
            parts = (*name.split("."), *(rel[:-1] if package else rel))
            out.setdefault(".".join(parts), (path, package))
        for path in top.rglob("*.c"):  # extensions: setup.py builds name from name.c
            rel = path.relative_to(top).with_suffix("").parts
            out[".".join((*name.split("."), *rel))] = (None, False)
    return out


MODULES = _modules()


def unit_of(module: str) -> str | None:
    """The most specific unit naming `module`; the package itself only names itself."""
    best = None
    for unit in LAYER_OF:
        if module == unit or (unit != "distdoctor" and module.startswith(unit + ".")):
            if best is None or len(unit) > len(best):
                best = unit
    return best


def _imported(module: str, package: bool, node: ast.AST) -> list[str]:
    """The distdoctor modules one import statement names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "distdoctor"]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        here = module.split(".") if package else module.split(".")[:-1]
        base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    if base.split(".")[0] != "distdoctor":
        return []
    # `from pkg import name` names the module pkg.name where there is one, else pkg
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _edges() -> list[tuple[str, str]]:
    edges = []
    for module, (path, package) in MODULES.items():
        if path is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            edges.extend((module, target) for target in _imported(module, package, node))
    return edges


EDGES = _edges()


def test_every_module_has_a_layer():
    assert MODULES, "no sources found"
    lost = sorted(m for m in MODULES if unit_of(m) is None)
    assert not lost, f"not in LAYERS (tests/test_layers.py), place them: {lost}"
    strays = sorted({t for _, t in EDGES if unit_of(t) is None})
    assert not strays, f"imports of modules no unit names: {strays}"


def test_no_import_points_up():
    up = []
    for module, target in EDGES:
        a, b = unit_of(module), unit_of(target)
        if a and b and LAYER_OF[b] > LAYER_OF[a]:
            up.append(f"{module} ({NAME_OF[a]}) imports {target} ({NAME_OF[b]})")
    assert not up, "imports that point up:\n  " + "\n  ".join(sorted(up))


def _loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The loops among units, as [a, b, ..., a]: the strongly connected groups (Tarjan's
    algorithm), then the shortest loop through each unit of a group (breadth first)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while not group or v not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    loops: list[list[str]] = []
    for group in groups:
        for start in sorted(group):  # the shortest loop through each unit of the group
            came: dict[str, str | None] = {start: None}
            todo = [start]
            loop = None
            for v in todo:  # breadth first: the list grows while it is walked
                for w in sorted(graph.get(v, ())):
                    if w == start and loop is None:
                        path = [v]
                        while came[path[-1]] is not None:
                            path.append(came[path[-1]])
                        loop = [*reversed(path), start]
                    elif w in group and w not in came:
                        came[w] = v
                        todo.append(w)
            if loop is not None and not any(set(loop) == set(seen) for seen in loops):
                loops.append(loop)
    return loops


def test_no_two_units_import_each_other():
    graph: dict[str, set[str]] = {}
    why: dict[tuple[str, str], set[str]] = {}
    for module, target in EDGES:
        a, b = unit_of(module), unit_of(target)
        if a and b and a != b:
            graph.setdefault(a, set()).add(b)
            why.setdefault((a, b), set()).add(f"{module} -> {target}")
    said = []
    for loop in _loops(graph):
        hops = [f"{a} -> {b} ({', '.join(sorted(why[(a, b)])[:2])})"
                for a, b in pairwise(loop)]
        said.append("\n    ".join(hops))
    assert not said, "units that import each other, around:\n    " + "\n  and\n    ".join(said)


@pytest.mark.parametrize("unit", sorted(u for u in LAYER_OF if MODULES.get(u, (0, 0))[1]))
def test_each_package_says_its_layer_and_what_it_may_import(unit):
    """Its __init__'s docstring names the layer LAYERS gives it, and what it may import."""
    path, _ = MODULES[unit]
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert f"Layer: {NAME_OF[unit]}" in doc, f"{path}: its docstring does not say its layer"
    assert "May import" in doc or "Imports nothing" in doc, \
        f"{path}: its docstring does not say what it may import"


def test_the_checks_see_what_they_must():
    """The walk finds lazy, relative and extension imports, and a made-up upward import
    would be caught: these checks cannot pass for want of looking."""
    assert ("distdoctor.runlog.slots", "distdoctor.runlog._fast") in EDGES  # in a function
    assert ("distdoctor.reference_trainer.config", "distdoctor.reference_trainer.faults") \
        in EDGES  # relative
    assert ("distdoctor.cli.common", "distdoctor.diagnosis.hangs.progress") in EDGES
    assert unit_of("distdoctor.runlog._fast") == "distdoctor.runlog"
    assert unit_of("distdoctor.tracer.recorder") == "distdoctor.tracer"
    assert unit_of("distdoctor.nonexistent") is None  # the package names only itself
    assert _loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _loops({"a": {"b", "c"}, "b": {"c"}, "c": {"a"}}) == [["a", "c", "a"],
                                                                 ["b", "c", "a", "b"]]
    assert _loops({"a": {"b"}, "b": set()}) == []
    module, package = "distdoctor.diagnosis.live", False
    (node,) = ast.parse("from ..views import snapshot").body
    assert _imported(module, package, node) == ["distdoctor.views.snapshot"]


def test_no_two_files_import_each_other():
    """Inside a package too: no module imports itself around a loop of files (data that
    flows one way between two files reads one way)."""
    graph: dict[str, set[str]] = {}
    for module, target in EDGES:
        if module != target:
            graph.setdefault(module, set()).add(target)
    said = [" -> ".join(loop) for loop in _loops(graph)]
    assert not said, "files that import each other, around:\n  " + "\n  ".join(said)


# The diagnosis package's parts, lowest first (docs/architecture.md, "Who owns what"): a
# detector never imports the engine that runs it, the engine never its drivers.
DIAGNOSIS_PARTS = (
    ("distdoctor.diagnosis.rendezvous", "distdoctor.diagnosis.report"),
    ("distdoctor.diagnosis.mismatches",),
    ("distdoctor.diagnosis.parting",),
    ("distdoctor.diagnosis.hangs", "distdoctor.diagnosis.stragglers",
     "distdoctor.diagnosis.flight_recorder"),
    ("distdoctor.diagnosis.crashes",),
    ("distdoctor.diagnosis.engine",),
    ("distdoctor.diagnosis.live", "distdoctor.diagnosis.live_ranks",
     "distdoctor.diagnosis.postmortem", "distdoctor.diagnosis.optional",
     "distdoctor.diagnosis.pids", "distdoctor.diagnosis.budget"),
)


def _diagnosis_part(module: str) -> int | None:
    for i, units in enumerate(DIAGNOSIS_PARTS):
        if any(module == u or module.startswith(u + ".") for u in units):
            return i
    return None


def test_every_diagnosis_module_has_a_part():
    loose = [m for m in MODULES if m.startswith("distdoctor.diagnosis.")
             and _diagnosis_part(m) is None]
    assert not loose, f"place these in DIAGNOSIS_PARTS: {loose}"


def test_diagnosis_parts_point_down():
    up = sorted(f"{a} -> {b}" for a, b in EDGES
                if (pa := _diagnosis_part(a)) is not None
                and (pb := _diagnosis_part(b)) is not None and pb > pa)
    assert not up, "diagnosis imports pointing up its parts:\n  " + "\n  ".join(up)


def test_every_package_is_installed():
    """pyproject.toml lists its packages by name: one left out is missing from a wheel
    (an editable install would still find it, so only this catches it)."""
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    packages = {m for m, (_, package) in MODULES.items() if package}
    assert packages - listed == set(), "add to pyproject.toml's packages"


MAX_LINES = 400  # a room a reader takes in whole; past it, a seam is waiting to be cut


def test_no_file_is_over_400_lines():
    long = sorted(f"{path.relative_to(ROOT)}: {n}" for path, _ in MODULES.values()
                  if path is not None
                  and (n := len(path.read_text().splitlines())) > MAX_LINES)
    assert not long, f"files over {MAX_LINES} lines (split them along a seam):\n  " + \
        "\n  ".join(long)
