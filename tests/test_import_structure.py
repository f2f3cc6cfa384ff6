"""The package layering: every module imports on its own, no upward import, no cycle, and the
clause kind is dispatched in ``headwise.contract`` only.

Layers (docs/architecture.md, "Layers"), lowest first; a module may import only from its own
layer or lower ones, at module level, inside a function or under ``TYPE_CHECKING`` alike:

1 foundation (errors, config, heads, patterns, memory, atomic, jsonfile, validate, render,
bounds)
2 model  3 hooks  4 data, control (no cycle between them)  5 training  6 interop  7 analysis
8 forecast, report  9 contract  10 runspec  11 pipeline  11.5 the public facade
(``headwise/__init__``)  12 cli.

Module-level and lazy imports between modules must not form a cycle (``TYPE_CHECKING`` ones
never run and are left out of the cycle check). An edge is a module importing a module: ``from
headwise.x import y`` points at ``headwise.x.y`` when that is a module, else at ``headwise.x``;
the implicit import of a parent package is not an edge.
"""

from __future__ import annotations

import ast
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "headwise"

LAYERS: dict[str, float] = {
    "errors": 1, "config": 1, "heads": 1, "patterns": 1, "memory": 1, "atomic": 1, "jsonfile": 1,
    "validate": 1, "render": 1, "dtensors": 1, "bounds": 1, "confidence": 1, "model": 2,
    "hooks": 3, "data": 4, "control": 4,
    "training": 5, "interop": 6, "analysis": 7, "forecast": 8, "report": 8, "contract": 9,
    "runspec": 10, "pipeline": 11, "cli": 12,
}
FACADE = 11.5  # ``headwise/__init__.py``

ALLOWED: set[tuple[str, str]] = set()  # no exception to the layering


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> float:
    """The layer of a ``headwise`` module (KeyError: a new top-level name needs a layer)."""
    parts = module.split(".")
    return FACADE if len(parts) == 1 else LAYERS[parts[1]]


def _resolve(name: str) -> str:
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _edges(module: str, path: Path) -> list[tuple[str, str, str, int]]:
    """``(module, imported module, kind, line)``; kind is ``module``, ``lazy`` or ``typing``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only, in_function = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(n) for n in ast.walk(node))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(n) for n in ast.walk(node))
    out = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if path.name == "__init__.py" else \
                    module.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        kind = ("typing" if id(node) in typing_only else
                "lazy" if id(node) in in_function else "module")
        out += [(module, _resolve(t), kind, node.lineno) for t in targets
                if t == "headwise" or t.startswith("headwise.")]
    return [e for e in out if e[0] != e[1]]


EDGES = [e for m, p in MODULES.items() for e in _edges(m, p)]


def test_every_module_has_a_layer():
    assert [m for m in MODULES if m != "headwise" and m.split(".")[1] not in LAYERS] == []


def _upward(edges: list[tuple[str, str, str, int]]) -> list[str]:
    return sorted(f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)}) [{kind}, line {line}]"
                  for a, b, kind, line in edges
                  if layer(b) > layer(a) and (a, b) not in ALLOWED)


def test_no_module_imports_a_higher_layer():
    assert _upward(EDGES) == []


def test_same_layer_packages_do_not_import_each_other_both_ways():
    pairs = {(a.split(".")[1], b.split(".")[1]) for a, b, _, _ in EDGES
             if a.count(".") and b.count(".") and a.split(".")[1] != b.split(".")[1]
             and layer(a) == layer(b) and (a, b) not in ALLOWED}
    assert sorted(p for p in pairs if p[::-1] in pairs) == []


def _cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(graph[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_import_cycle_between_modules():
    edges = {(a, b) for a, b, kind, _ in EDGES
             if kind != "typing" and (a, b) not in ALLOWED}
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_a_lazy_cycle():
    """The check can fail: a two-module and a three-module cycle are found, a chain is not."""
    assert _cycles({("a", "b"), ("b", "a"), ("c", "d")}) == [["a", "b"]]
    assert _cycles({("x", "y"), ("y", "z"), ("z", "x"), ("z", "w")}) == [["x", "y", "z"]]


# In a fresh interpreter, with ``headwise/__init__`` (the facade, which imports everything in a
# fixed order) replaced by a bare package so that it cannot hide an order dependence:
# 1. every module in a shuffled order;
# 2. every module first: from the top layer down (shuffled within a layer), drop every loaded
#    module of its layer and above, then import it (lower layers never import it, so what stays
#    loaded cannot mask a cycle through it).
_SCRIPT = """
import importlib, random, sys, types
seed, root, layers, modules = int(sys.argv[1]), sys.argv[2], eval(sys.argv[3]), sys.argv[4:]
facade = types.ModuleType("headwise")
facade.__path__ = [root]
sys.modules["headwise"] = facade
rng = random.Random(seed)
layer = lambda m: layers[m.split(".")[1]]
for name in rng.sample(modules, len(modules)):
    importlib.import_module(name)
for name in sorted(modules, key=lambda m: (-layer(m), rng.random())):
    for loaded in [k for k in sys.modules if k.startswith("headwise.")]:
        if layer(loaded) >= layer(name):
            del sys.modules[loaded]
    importlib.import_module(name)
print("imported", len(modules), "modules twice")
"""


def test_every_module_imports_first_and_in_a_random_order():
    seed = int(os.environ.get("HEADWISE_IMPORT_SEED", random.randrange(10**6)))
    print(f"import order seed: {seed} (rerun with HEADWISE_IMPORT_SEED={seed})")
    modules = [m for m in MODULES if m != "headwise"]
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _SCRIPT, str(seed), str(PACKAGE), repr(LAYERS),
         *modules], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, f"seed {seed}:\n{done.stderr[-3000:]}"
    assert f"imported {len(modules)} modules" in done.stdout


@pytest.mark.parametrize("source, message", [
    ("from headwise.pipeline.run import x\n", "imports headwise.pipeline.run (layer 11) [module"),
    ("def f():\n    import headwise.cli\n", "imports headwise.cli (layer 12) [lazy"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from headwise import data\n",
     "imports headwise.data (layer 4) [typing"),
])
def test_an_upward_import_is_reported(tmp_path, source, message):
    """The layer check reads imports at module level, inside functions and for typing."""
    fake = tmp_path / "block.py"
    fake.write_text(source)
    upward = _upward(_edges("headwise.model.block", fake))
    assert len(upward) == 1 and message in upward[0]


CLAUSE_KINDS = {"score", "ablation", "exclusive", "task", "preserve", "path", "circuit"}


def _kind_dispatch(path: Path) -> list[int]:
    """Lines comparing a ``.kind`` attribute or a ``["kind"]`` item with a clause kind's name."""
    def is_kind(node: ast.AST) -> bool:
        return ((isinstance(node, ast.Attribute) and node.attr == "kind")
                or (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                    and node.slice.value == "kind"))

    def names_kind(node: ast.AST) -> bool:
        values = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return any(isinstance(v, ast.Constant) and v.value in CLAUSE_KINDS for v in values)

    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(is_kind(x) for x in sides) and any(names_kind(x) for x in sides):
                lines.append(node.lineno)
        elif isinstance(node, ast.Dict) and any(
                isinstance(k, ast.Constant) and k.value in CLAUSE_KINDS for k in node.keys) \
                and len(node.keys) >= 2 and all(
                isinstance(k, ast.Constant) and k.value in CLAUSE_KINDS for k in node.keys):
            lines.append(node.lineno)  # a dispatch table keyed by kind
    return lines


def test_clause_kinds_are_dispatched_in_the_contract_package_only():
    outside = {m: _kind_dispatch(p) for m, p in MODULES.items()
               if not m.startswith("headwise.contract")}
    assert {m: lines for m, lines in outside.items() if lines} == {}


# The modules of the clause kinds and their registry: only ``headwise.contract`` imports them
# (everything else reaches a kind through ``clause.entry``), and only the parser reads ``KINDS``.
KIND_MODULES = {f"headwise.contract.{k}" for k in (*CLAUSE_KINDS, "kinds")}


def _kind_imports(edges: list[tuple[str, str, str, int]]) -> list[tuple[str, str, int]]:
    """``(module, kind module, line)`` for each import of a kind's module from outside
    ``headwise.contract``."""
    return [(m, t, line) for m, t, _, line in edges
            if t in KIND_MODULES and not m.startswith("headwise.contract")]


def test_no_kind_module_is_imported_outside_the_contract_package():
    assert _kind_imports(EDGES) == []


def test_only_the_parser_reads_the_kind_registry():
    readers = {m for m, p in MODULES.items()
               if "KINDS" in {n.id for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                              if isinstance(n, ast.Name)}}
    # the registry itself, the parser, and the package's public re-export
    assert readers <= {"headwise.contract.kinds", "headwise.contract.parse", "headwise.contract"}


def test_a_kind_helper_imported_from_outside_is_found(tmp_path):
    fake = tmp_path / "heldout.py"
    fake.write_text("from headwise.contract.preserve import named_heads\n")
    assert _kind_imports(_edges("headwise.pipeline.heldout", fake)) == [
        ("headwise.pipeline.heldout", "headwise.contract.preserve", 1)]


@pytest.mark.parametrize("source", [
    "if clause.kind == 'score':\n    pass\n",
    "x = r['kind'] in ('ablation', 'exclusive')\n",
    "LEVERS = {'score': 1, 'task': 2}\n",
])
def test_a_kind_dispatch_is_found(tmp_path, source):
    """The dispatch check can fail: comparisons and dispatch tables are found."""
    fake = tmp_path / "m.py"
    fake.write_text(source)
    assert _kind_dispatch(fake) == [1]


def test_a_probe_kind_is_not_a_clause_kind(tmp_path):
    fake = tmp_path / "m.py"
    fake.write_text("if probe.kind == 'repeated':\n    pass\nkind = 'task'\n")
    assert _kind_dispatch(fake) == []


def test_commands_do_not_import_sharded_training_until_it_is_used() -> None:
    """``torch.distributed.tensor`` (a large share of ``import headwise``) loads only for
    sharded training: every command and subprocess starts without it."""
    code = ("import sys, headwise, headwise.cli, headwise.pipeline.run, "
            "headwise.pipeline.run_report; print(sorted(m for m in ('torch.distributed.tensor', "
            "'torch.distributed.fsdp', 'torch.distributed.checkpoint') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "[]"


def test_importing_headwise_changes_no_global_torch_state() -> None:
    """``import headwise`` (and every subpackage) leaves torch's process-wide module hooks and
    defaults as they were: compared in a fresh interpreter, before and after the import."""
    code = """
import torch
import torch.nn.modules.module as m
def state():
    hooks = {n: dict(getattr(m, n)) for n in dir(m) if n.startswith("_global_")
             and n.endswith("hooks") and isinstance(getattr(m, n), dict)}
    return hooks, torch.get_default_dtype(), torch.is_grad_enabled()
before = state()
import headwise, headwise.cli, headwise.pipeline.run
after = state()
print(sorted(before[0]))
print(before == after)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    names, same = out.stdout.split("\n")[:2]
    for name in ("_global_module_registration_hooks", "_global_forward_hooks",
                 "_global_forward_pre_hooks", "_global_backward_hooks"):
        assert name in names  # the check sees torch's hook tables
    assert same == "True"
