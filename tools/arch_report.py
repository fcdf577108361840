"""Architecture report of the product packages, to compare a redesign before and after.

    .venv/bin/python -m tools.arch_report [--json] [--root DIR] [--depth N]

Reads the source only (the standard library's `ast`, and `networkx` for the cycles); nothing
is imported or run. The product packages are `orchestrator`, `edge_agent`, `schemas`, `sim`
and `cli` (those present under the root); `tools`, `tests`, `benchmarks` and `__pycache__`
are left out wherever they are. What it reports:

1. Rooms: each directory holding .py files (a package or subpackage), its module count and
   its non-blank lines.
2. The largest functions and methods by line span (`def` line to last line, decorators not
   counted; a nested function is listed on its own and also counts in its parent's span).
3. Private accesses. The rule: a name with a leading underscore that is not a dunder
   (`_x`, `__x`, not `__x__`) belongs to the module or class that defines it. Counted:
   - "direct": an attribute access `x._name` (load, store or del) whose object `x` is
     anything but bare `self`/`cls` or `super()`: `other._x`, `mod._helper`, and also
     `o._spawn` where `o` is a local alias of a collaborator;
   - "back-reference": an attribute chain rooted at `self`/`cls` whose last element is
     private, through at least one collaborator: `self.o._spawn`, `self.o.view._alive`;
   - "import": `from m import _name`.
   `self._x` and `cls._x` are fine (a class's own state). Which object `x` is is not known,
   so `other._x` on an instance of a class of the same module counts too, but is flagged
   (`own_name`, and its total printed) when the module itself defines a private name so
   spelled (a def, a class, a variable, a `self._x =`); a standard library private
   (`os._exit`) counts too. The namedtuple API (`_replace`, `_asdict`, `_fields`, `_make`,
   `_field_defaults`) is public and not counted.
4. Import cycles: a graph of product modules, one edge per `import`/`from ... import` that
   names one (relative imports resolved; `from p import n` is an edge to `p.n` when that is a
   module, else to `p`; the parent packages a dotted import also runs are not edges). Each
   edge has a kind: "eager" (runs at import), "lazy" (inside a function) or "typing" (under
   `if TYPE_CHECKING:`, never run). Strongly connected components of more than one module
   are reported for eager edges, eager + lazy (all that runs), and all three (the design's
   coupling).
5. Cross-room rules (violations only, any kind of import): `schemas` imports nothing of
   `orchestrator`/`edge_agent`/`sim`; `orchestrator.predictor` imports no `edge_agent` module
   and no orchestrator module outside `orchestrator.predictor` and `orchestrator.scheduling`;
   `orchestrator` imports no `sim`, except its console (`orchestrator.cli`, or a `cli`/
   `console` subpackage); and how many modules import `orchestrator.service`.
6. Submission call depth, a STATIC ESTIMATE. The entry is the API's submit handler: the
   callable next to the string "submit" in an endpoint tuple of `orchestrator/service.py`
   (else a method `submit` in `orchestrator/submissions.py` or `orchestrator/service.py`).
   The targets are the functions of `orchestrator` that build a `CommitCommand`. Nodes are
   top-level functions and methods (a nested function's calls count as its parent's). Edges:
   - "call": a call resolved by name: a function of this module or one it imports (through
     package re-exports), `Class(...)` to its `__init__`, `self.m(...)` in the class or its
     product bases, `x.m(...)` where the class of `x` is known: `self`, a parameter's
     annotation, a local alias assigned once (`o = self.o`, `pid, o = ..., self.o`), an
     attribute typed by the class's annotations or its `__init__` (`self.a = A(...)`,
     `self.o = o` with `o: Orchestrator`), or a function's return annotation;
   - "by-name": `x.m(...)` with `x` unknown (neither resolved as above nor known to come
     from outside the product: `np.where`, `nc.subscribe` with `nc: NATS`), to the one method
     named `m` in the product when exactly one is (names that builtin containers or asyncio
     primitives also have, such as `get` or `wait`, are never guessed);
   - "ref": a function resolved as above and used as a value, not called
     (`functools.partial(self.submit, ...)`, a callback; a property read too): it is assumed
     to be called;
   - "queue": a method that puts on `self.<q>` (`put`/`put_nowait`) to each method of its
     class that takes from it (`get`/`get_nowait`), the handoff of a work queue;
   - "port": a call resolved to a method of a `typing.Protocol` class (a port), to the one
     product class that implements a method of that name (protocols' methods are never
     by-name targets).
   Missed: dynamic dispatch, callbacks stored in containers, getattr, calls through values
   returned without annotations. The shortest path (by hops) from the entry to a target is
   printed, function by function, with the number of modules the functions reachable from
   the entry within `--depth` hops touch.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import sys
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

PRODUCT_PACKAGES = ("orchestrator", "edge_agent", "schemas", "sim", "console", "transport", "cli")
EXCLUDED_DIRS = frozenset({"tools", "tests", "benchmarks", "__pycache__"})
#: namedtuple's public API, underscored so as not to clash with field names.
PUBLIC_UNDERSCORED = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})
#: Method names never resolved by uniqueness alone: builtin containers and asyncio have them.
GENERIC_METHODS = frozenset(
    name
    for kind in (
        dict,
        list,
        set,
        str,
        bytes,
        asyncio.Event,
        asyncio.Queue,
        asyncio.Future,
        asyncio.Task,
        asyncio.Lock,
        asyncio.Condition,
    )
    for name in dir(kind)
)
KIND_RANK = {"eager": 0, "lazy": 1, "typing": 2}
TOP = 10
DEFAULT_DEPTH = 6

FuncNode = ast.FunctionDef | ast.AsyncFunctionDef


def _is_private(name: str) -> bool:
    return (
        name.startswith("_")
        and not (name.startswith("__") and name.endswith("__"))
        and name not in PUBLIC_UNDERSCORED
    )


@dataclass
class Module:
    name: str
    rel: str
    room: str
    is_package: bool
    tree: ast.Module
    lines: int


@dataclass
class Func:
    key: str
    module: str
    qualname: str
    node: FuncNode
    cls: str | None  # key of the class it is a method of
    owner: str  # key of the top-level function or method whose body holds it


@dataclass
class ClassInfo:
    key: str
    module: str
    node: ast.ClassDef
    methods: dict[str, str] = field(default_factory=dict)
    #: attribute -> (expression giving its type, the function it is read in or None, is an
    #: annotation)
    attrs: dict[str, tuple[ast.expr, str | None, bool]] = field(default_factory=dict)


@dataclass(frozen=True)
class ImportEdge:
    src: str
    dst: str
    line: int
    kind: str


@dataclass(frozen=True)
class PrivateAccess:
    file: str
    line: int
    name: str
    category: str
    text: str
    #: The module defines a name so spelled itself (a function, class, module or class
    #: variable, or a `self._x =`): likely its own object's, not another module's.
    own_name: bool


# -- discovery ---------------------------------------------------------------------------------


def _py_files(root: Path) -> Iterator[Path]:
    for pkg in PRODUCT_PACKAGES:
        base = root / pkg
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            if not EXCLUDED_DIRS.intersection(path.relative_to(root).parts[:-1]):
                yield path


def discover(root: Path) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in _py_files(root):
        rel = path.relative_to(root)
        parts = list(rel.with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        source = path.read_text(encoding="utf-8")
        name = ".".join(parts)
        modules[name] = Module(
            name=name,
            rel=rel.as_posix(),
            room=rel.parent.as_posix(),
            is_package=is_package,
            tree=ast.parse(source, filename=str(path)),
            lines=sum(1 for line in source.splitlines() if line.strip()),
        )
    return modules


def rooms(modules: dict[str, Module]) -> list[dict[str, Any]]:
    per: dict[str, list[Module]] = {}
    for m in modules.values():
        per.setdefault(m.room, []).append(m)
    return [
        {"room": room, "modules": len(ms), "lines": sum(m.lines for m in ms)}
        for room, ms in sorted(per.items())
    ]


# -- functions and classes ---------------------------------------------------------------------


def _index(modules: dict[str, Module]) -> tuple[dict[str, Func], dict[str, ClassInfo]]:
    funcs: dict[str, Func] = {}
    classes: dict[str, ClassInfo] = {}

    def visit(mod: str, node: ast.AST, prefix: str, cls: str | None, owner: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                qual = prefix + child.name
                key = f"{mod}:{qual}"
                classes[key] = ClassInfo(key=key, module=mod, node=child)
                visit(mod, child, qual + ".", key, owner)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                qual = prefix + child.name
                key = f"{mod}:{qual}"
                funcs[key] = Func(key, mod, qual, child, cls, owner or key)
                if cls is not None:
                    classes[cls].methods.setdefault(child.name, key)
                visit(mod, child, qual + ".<locals>.", None, owner or key)
            else:
                visit(mod, child, prefix, cls, owner)

    for m in modules.values():
        visit(m.name, m.tree, "", None, None)
    return funcs, classes


def largest_functions(
    modules: dict[str, Module], funcs: dict[str, Func], top: int = TOP
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [
        {
            "function": f.qualname,
            "file": modules[f.module].rel,
            "line": f.node.lineno,
            "lines": (f.node.end_lineno or f.node.lineno) - f.node.lineno + 1,
        }
        for f in funcs.values()
    ]
    rows.sort(key=lambda r: (-r["lines"], r["file"], r["line"]))
    return rows[:top]


# -- private accesses ----------------------------------------------------------------------------


def _root_name(node: ast.expr) -> str | None:
    """The bare name an attribute chain starts from."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _own_private_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
    return {n for n in names if _is_private(n)}


def private_accesses(modules: dict[str, Module]) -> list[PrivateAccess]:
    found: list[PrivateAccess] = []
    for m in modules.values():
        own = _own_private_names(m.tree)
        for node in ast.walk(m.tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if _is_private(alias.name):
                        src = "." * node.level + (node.module or "")
                        found.append(
                            PrivateAccess(
                                m.rel, node.lineno, alias.name, "import",
                                f"from {src} import {alias.name}", False,
                            )
                        )  # fmt: skip
            elif isinstance(node, ast.Attribute) and _is_private(node.attr):
                base = node.value
                if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                    continue
                if (
                    isinstance(base, ast.Call)
                    and isinstance(base.func, ast.Name)
                    and base.func.id == "super"
                ):
                    continue
                category = "back-reference" if _root_name(base) in ("self", "cls") else "direct"
                text = ast.unparse(node)
                found.append(
                    PrivateAccess(m.rel, node.lineno, node.attr, category, text, node.attr in own)
                )
    found.sort(key=lambda p: (p.file, p.line, p.name))
    return found


def private_summary(found: list[PrivateAccess], top: int = TOP) -> dict[str, Any]:
    per_file: Counter[str] = Counter(p.file for p in found)
    per_name: Counter[str] = Counter(p.name for p in found)
    per_category: Counter[str] = Counter(p.category for p in found)
    return {
        "total": len(found),
        "own_name": sum(p.own_name for p in found),
        "by_category": dict(sorted(per_category.items())),
        "files": len(per_file),
        "per_file": dict(sorted(per_file.items(), key=lambda kv: (-kv[1], kv[0]))),
        "top_files": per_file.most_common(top),
        "top_names": per_name.most_common(top),
        "accesses": [p.__dict__ for p in found],
    }


# -- imports -----------------------------------------------------------------------------------


def _package_of(m: Module) -> str:
    return m.name if m.is_package else m.name.rpartition(".")[0]


def _resolve_from(m: Module, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = _package_of(m).split(".") if _package_of(m) else []
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    if node.module:
        base.append(node.module)
    return ".".join(base)


def _longest_module(name: str, modules: dict[str, Module]) -> str | None:
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports_with_kind(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    def visit(node: ast.AST, in_func: bool, typing: bool) -> Iterator[Any]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, "typing" if typing else "lazy" if in_func else "eager"
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), in_func, True)
                for stmt in child.orelse:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), in_func, typing)
            else:
                inner = in_func or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
                yield from visit(child, inner, typing)

    yield from visit(tree, False, False)


def import_edges(modules: dict[str, Module]) -> list[ImportEdge]:
    edges: list[ImportEdge] = []
    for m in modules.values():
        for node, kind in _imports_with_kind(m.tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                for alias in node.names:
                    t = _longest_module(alias.name, modules)
                    if t is not None:
                        targets.append(t)
            else:
                base = _resolve_from(m, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}" if base else alias.name
                    t = sub if sub in modules else _longest_module(base, modules)
                    if t is not None:
                        targets.append(t)
            for t in dict.fromkeys(targets):
                if t != m.name:
                    edges.append(ImportEdge(m.name, t, node.lineno, kind))
    return edges


def _graph(edges: list[ImportEdge], kinds: set[str]) -> Any:
    g = nx.DiGraph()
    g.add_edges_from((e.src, e.dst) for e in edges if e.kind in kinds)
    return g


def import_cycles(edges: list[ImportEdge]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, kinds in (
        ("eager", {"eager"}),
        ("eager+lazy", {"eager", "lazy"}),
        ("all (with TYPE_CHECKING)", {"eager", "lazy", "typing"}),
    ):
        sccs = [
            sorted(c) for c in nx.strongly_connected_components(_graph(edges, kinds)) if len(c) > 1
        ]
        sccs.sort(key=lambda c: (-len(c), c))
        out[label] = sccs
    lazy = sorted({(e.src, e.dst) for e in edges if e.kind == "lazy"})
    out["lazy_edges"] = [list(p) for p in lazy]
    return out


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _is_protocol(node: ast.ClassDef) -> bool:
    return any(
        (isinstance(b, ast.Name) and b.id == "Protocol")
        or (isinstance(b, ast.Attribute) and b.attr == "Protocol")
        for b in node.bases
    )


def rule_violations(edges: list[ImportEdge], modules: dict[str, Module]) -> dict[str, Any]:
    violations: list[str] = []

    def add(e: ImportEdge, rule: str) -> None:
        where = f"{modules[e.src].rel}:{e.line}"
        violations.append(f"{rule}: {e.src} -> {e.dst} ({e.kind}, {where})")

    for e in sorted(edges, key=lambda e: (e.src, e.line, e.dst)):
        if _in(e.src, "schemas") and any(
            _in(e.dst, p) for p in ("orchestrator", "edge_agent", "sim", "console", "transport")
        ):
            add(e, "schemas imports a service/sim module")
        if _in(e.src, "schemas") and _in(e.dst, "nats"):
            add(e, "schemas does bus I/O")
        if _in(e.src, "orchestrator.placement") and _in(e.dst, "orchestrator.reliability"):
            add(e, "placement imports reliability")
        if not _in(e.src, "console") and _in(e.dst, "console"):
            add(e, "product code imports the console")
        if _in(e.src, "orchestrator.predictor"):
            if _in(e.dst, "edge_agent"):
                add(e, "predictor imports edge_agent")
            elif _in(e.dst, "orchestrator") and not any(
                _in(e.dst, p) for p in ("orchestrator.predictor", "orchestrator.scheduling")
            ):
                add(e, "predictor imports orchestrator outside predictor/scheduling")
        console = any(_in(e.src, p) for p in ("orchestrator.cli", "orchestrator.console"))
        if _in(e.src, "orchestrator") and not console and _in(e.dst, "sim"):
            add(e, "orchestrator imports sim")
        if any(_in(e.src, p) for p in ("edge_agent", "transport")) and _in(e.dst, "sim"):
            add(e, "a service imports sim")
    importers: dict[str, set[str]] = {}
    for e in edges:
        if e.dst == "orchestrator.service":
            importers.setdefault(e.src, set()).add(e.kind)
    return {
        "violations": violations,
        "service_importers": {
            k: sorted(v, key=KIND_RANK.__getitem__) for k, v in sorted(importers.items())
        },
    }


# -- call graph ------------------------------------------------------------------------------------

#: ("module" | "class" | "instance" | "func" | "external", a name or key): what an expression
#: is; "external" is anything from outside the product (its methods are never guessed).
Target = tuple[str, str]


@dataclass
class Ctx:
    module: str
    cls: str | None = None
    aliases: dict[str, ast.expr] = field(default_factory=dict)
    params: dict[str, ast.expr | None] = field(default_factory=dict)


class CallGraph:
    """The static call graph of the product's top-level functions and methods."""

    def __init__(self, modules: dict[str, Module]) -> None:
        self.modules = modules
        self.funcs, self.classes = _index(modules)
        self.imports: dict[str, dict[str, tuple[str, str | None]]] = {
            m.name: self._import_map(m) for m in modules.values()
        }
        self.top_defs: dict[str, dict[str, Target]] = {m: {} for m in modules}
        for f in self.funcs.values():
            if "." not in f.qualname:
                self.top_defs[f.module][f.qualname] = ("func", f.key)
        for c in self.classes.values():
            qual = c.key.split(":", 1)[1]
            if "." not in qual:
                self.top_defs[c.module][qual] = ("class", c.key)
        #: classes that are typing.Protocols: their methods are declarations (a port), and a
        #: call through one goes to the one product class that implements that method
        self.protocols = {k for k, c in self.classes.items() if _is_protocol(c.node)}
        by_name: dict[str, list[str]] = {}
        for k, c in self.classes.items():
            if k in self.protocols:
                continue
            for name, key in c.methods.items():
                by_name.setdefault(name, []).append(key)
        self.unique_methods = {
            n: ks[0] for n, ks in by_name.items() if len(ks) == 1 and n not in GENERIC_METHODS
        }
        self.ctxs: dict[str, Ctx] = {}
        for c in self.classes.values():
            self._class_attrs(c)
        self._attr_cache: dict[tuple[str, str], Target | None] = {}
        self._bases_cache: dict[str, list[str]] = {}
        self.edges: dict[str, dict[str, str]] = {}
        for f in self.funcs.values():
            if f.owner == f.key:
                self.edges[f.key] = self._edges_of(f)

    # imports and names

    def _import_map(self, m: Module) -> dict[str, tuple[str, str | None]]:
        """Local name -> (module, attribute or None for the module itself)."""
        out: dict[str, tuple[str, str | None]] = {}
        for node, _kind in _imports_with_kind(m.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        out.setdefault(a.asname, (a.name, None))
                    else:
                        head = a.name.split(".")[0]
                        out.setdefault(head, (head, None))
            else:
                base = _resolve_from(m, node)
                for a in node.names:
                    if a.name != "*":
                        out.setdefault(a.asname or a.name, (base, a.name))
        return out

    def symbol(self, module: str, name: str, depth: int = 0) -> Target | None:
        if depth > 6 or module not in self.modules:
            return None
        if name in self.top_defs[module]:
            return self.top_defs[module][name]
        imported = self.imports[module].get(name)
        if imported is None:
            return None
        src, attr = imported
        if _longest_module(src, self.modules) is None:
            return ("external", src if attr is None else f"{src}.{attr}")
        if attr is None:
            return ("module", src) if src in self.modules else None
        if f"{src}.{attr}" in self.modules:
            return ("module", f"{src}.{attr}")
        return self.symbol(src, attr, depth + 1)

    # classes

    def _ctx(self, f: Func) -> Ctx:
        owner = self.funcs[f.owner]
        if owner.key in self.ctxs:
            return self.ctxs[owner.key]
        ctx = Ctx(module=owner.module, cls=owner.cls)
        assigned: Counter[str] = Counter()
        values: dict[str, ast.expr] = {}
        for node in ast.walk(owner.node):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs):
                    ctx.params.setdefault(arg.arg, arg.annotation)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name) and isinstance(node, ast.AnnAssign):
                        ctx.params.setdefault(t.id, node.annotation)  # typed as declared
                    elif isinstance(t, ast.Name) and node.value is not None:
                        assigned[t.id] += 1
                        values[t.id] = node.value
                    elif isinstance(t, ast.Tuple):
                        vals = node.value.elts if isinstance(node.value, ast.Tuple) else None
                        for i, elt in enumerate(t.elts):
                            if isinstance(elt, ast.Name):
                                assigned[elt.id] += 1
                                if vals is not None and len(vals) == len(t.elts):
                                    values[elt.id] = vals[i]
            elif isinstance(node, ast.For | ast.AsyncFor | ast.With | ast.AsyncWith):
                names = (
                    [node.target]
                    if isinstance(node, ast.For | ast.AsyncFor)
                    else [i.optional_vars for i in node.items if i.optional_vars is not None]
                )
                for t in names:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            assigned[n.id] += 2  # never an alias
        ctx.aliases = {n: v for n, v in values.items() if assigned[n] == 1 and n not in ctx.params}
        self.ctxs[owner.key] = ctx
        return ctx

    def _class_attrs(self, c: ClassInfo) -> None:
        for stmt in c.node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                c.attrs.setdefault(stmt.target.id, (stmt.annotation, None, True))
        init = c.methods.get("__init__")
        if init is None:
            return
        for node in ast.walk(self.funcs[init].node):
            t: ast.expr
            if isinstance(node, ast.AnnAssign):
                t, value, ann = node.target, node.annotation, True
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                t, value, ann = node.targets[0], node.value, False
            else:
                continue
            if (
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
            ):
                c.attrs.setdefault(t.attr, (value, init, ann))

    def bases(self, cls: str) -> list[str]:
        """The class and its product bases, nearest first."""
        if cls in self._bases_cache:
            return self._bases_cache[cls]
        self._bases_cache[cls] = [cls]
        order, queue = [cls], deque([cls])
        while queue:
            c = self.classes[queue.popleft()]
            for b in c.node.bases:
                t = self.resolve(b, Ctx(module=c.module))
                if t is not None and t[0] == "class" and t[1] not in order:
                    order.append(t[1])
                    queue.append(t[1])
        self._bases_cache[cls] = order
        return order

    def _member(self, cls: str, name: str) -> Target | None:
        for c in self.bases(cls):
            info = self.classes[c]
            if name in info.methods:
                return ("func", info.methods[name])
        for c in self.bases(cls):
            key = (c, name)
            if key in self._attr_cache:
                return self._attr_cache[key]
            info = self.classes[c]
            if name in info.attrs:
                self._attr_cache[key] = None  # guards recursion
                expr, where, ann = info.attrs[name]
                ctx = self._ctx(self.funcs[where]) if where else Ctx(module=info.module)
                t = self.annotation(expr, ctx.module) if ann else self.resolve(expr, ctx)
                self._attr_cache[key] = t
                return t
        return None

    def annotation(self, expr: ast.expr | None, module: str) -> Target | None:
        """The instance type an annotation names, if it is a product class."""
        if expr is None:
            return None
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            try:
                expr = ast.parse(expr.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
            return self.annotation(expr.left, module) or self.annotation(expr.right, module)
        if isinstance(expr, ast.Subscript):
            head = expr.value
            name = head.attr if isinstance(head, ast.Attribute) else getattr(head, "id", "")
            return self.annotation(expr.slice, module) if name == "Optional" else None
        t = self.resolve(expr, Ctx(module=module))
        if t is not None and t[0] == "class":
            return ("instance", t[1])
        return t if t is not None and t[0] == "external" else None

    def resolve(self, expr: ast.expr, ctx: Ctx, depth: int = 0) -> Target | None:
        if depth > 12:
            return None
        if isinstance(expr, ast.Name):
            if expr.id in ("self", "cls") and ctx.cls is not None:
                return ("instance", ctx.cls)
            if expr.id in ctx.aliases:
                return self.resolve(ctx.aliases[expr.id], ctx, depth + 1)
            if expr.id in ctx.params:
                return self.annotation(ctx.params[expr.id], ctx.module)
            return self.symbol(ctx.module, expr.id)
        if isinstance(expr, ast.Attribute):
            base = self.resolve(expr.value, ctx, depth + 1)
            if base is None:
                return None
            if base[0] == "module":
                sub = f"{base[1]}.{expr.attr}"
                return ("module", sub) if sub in self.modules else self.symbol(base[1], expr.attr)
            if base[0] in ("instance", "class"):
                return self._member(base[1], expr.attr)
            return base if base[0] == "external" else None
        if isinstance(expr, ast.Call):
            t = self.resolve(expr.func, ctx, depth + 1)
            if t is None:
                return None
            if t[0] == "class":
                return ("instance", t[1])
            if t[0] == "func":
                f = self.funcs[t[1]]
                return self.annotation(f.node.returns, f.module)
            return t if t[0] == "external" else None
        if isinstance(expr, ast.Await):
            return self.resolve(expr.value, ctx, depth + 1)
        return None

    def _dotted(self, expr: ast.expr, ctx: Ctx, depth: int = 0) -> str | None:
        if depth > 12:
            return None
        if isinstance(expr, ast.Name):
            if expr.id in ctx.aliases:
                return self._dotted(ctx.aliases[expr.id], ctx, depth + 1)
            return expr.id
        if isinstance(expr, ast.Attribute):
            base = self._dotted(expr.value, ctx, depth + 1)
            return None if base is None else f"{base}.{expr.attr}"
        return None

    def _queue_ops(self, f: Func) -> tuple[set[str], set[str]]:
        ctx = self._ctx(f)
        puts: set[str] = set()
        gets: set[str] = set()
        for node in ast.walk(f.node):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                q = self._dotted(node.func.value, ctx)
                if q is None or not q.startswith("self."):
                    continue
                if node.func.attr in ("put", "put_nowait"):
                    puts.add(q)
                elif node.func.attr in ("get", "get_nowait"):
                    gets.add(q)
        return puts, gets

    def _edges_of(self, f: Func) -> dict[str, str]:
        ctx = self._ctx(f)
        out: dict[str, str] = {}

        def add(target: str, kind: str) -> None:
            target = self.funcs[target].owner
            decl = self.funcs[target]
            if decl.cls in self.protocols:  # through a port: to what implements it
                impl = self.unique_methods.get(decl.node.name)
                if impl is None:
                    return
                target, kind = self.funcs[impl].owner, "port"
            if target != f.key and (target not in out or kind == "call"):
                out[target] = kind

        called: set[int] = set()
        for node in ast.walk(f.node):
            if not isinstance(node, ast.Call):
                continue
            called.add(id(node.func))
            t = self.resolve(node.func, ctx)
            if t is not None and t[0] == "func":
                add(t[1], "call")
            elif t is not None and t[0] == "class":
                init = self._member(t[1], "__init__")
                if init is not None and init[0] == "func":
                    add(init[1], "call")
            elif t is None and isinstance(node.func, ast.Attribute):
                key = self.unique_methods.get(node.func.attr)
                if key is not None:
                    add(key, "by-name")
        for node in ast.walk(f.node):
            if (
                isinstance(node, ast.Name | ast.Attribute)
                and isinstance(node.ctx, ast.Load)
                and id(node) not in called
            ):
                t = self.resolve(node, ctx)
                if t is not None and t[0] == "func":
                    add(t[1], "ref")
        if f.cls is not None:
            puts, _ = self._queue_ops(f)
            if puts:
                for name, key in self.classes[f.cls].methods.items():
                    _, gets = self._queue_ops(self.funcs[key])
                    if name != "__init__" and puts & gets:
                        add(key, "queue")
        return out

    # the walk

    def label(self, key: str) -> str:
        f = self.funcs[key]
        return f"{f.module}.{f.qualname}"

    def submit_entry(self) -> tuple[str | None, str]:
        for mod in ("orchestrator.service",):
            if mod not in self.modules:
                continue
            for f in self.funcs.values():
                if f.module != mod or f.owner != f.key:
                    continue
                for node in ast.walk(f.node):
                    if not (
                        isinstance(node, ast.Tuple)
                        and node.elts
                        and isinstance(node.elts[0], ast.Constant)
                        and node.elts[0].value == "submit"
                    ):
                        continue
                    for elt in node.elts[1:]:
                        t = self.resolve(elt, self._ctx(f))
                        if t is not None and t[0] == "func":
                            where = f"{self.modules[mod].rel}:{node.lineno}"
                            return t[1], f"the endpoint tuple ('submit', ...) at {where}"
        for mod in ("orchestrator.submissions", "orchestrator.service"):
            for f in self.funcs.values():
                if f.module == mod and f.cls is not None and f.node.name == "submit":
                    return f.key, f"a method named submit in {mod}"
        return None, "no submit handler found"

    def commit_targets(self) -> list[str]:
        out = []
        for f in self.funcs.values():
            if not _in(f.module, "orchestrator"):
                continue
            for node in ast.walk(f.node):
                if isinstance(node, ast.Call):
                    fn = node.func
                    name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                    if name == "CommitCommand":
                        out.append(f.owner)
                        break
        return sorted(set(out))

    def distances(self, entry: str) -> tuple[dict[str, int], dict[str, str]]:
        dist, parent = {entry: 0}, {}
        queue = deque([entry])
        while queue:
            cur = queue.popleft()
            for nxt in sorted(self.edges.get(cur, {})):
                if nxt not in dist:
                    dist[nxt] = dist[cur] + 1
                    parent[nxt] = cur
                    queue.append(nxt)
        return dist, parent


def submission_depth(modules: dict[str, Module], depth: int) -> dict[str, Any]:
    g = CallGraph(modules)
    entry, how = g.submit_entry()
    targets = g.commit_targets()
    out: dict[str, Any] = {
        "static_estimate": True,
        "entry": g.label(entry) if entry else None,
        "entry_found_by": how,
        "targets": [g.label(t) for t in targets],
        "path": [],
        "functions_on_path": None,
        "reach": [],
        "depth": depth,
    }
    if entry is None:
        return out
    dist, parent = g.distances(entry)
    reached = [t for t in targets if t in dist]
    if reached:
        best = min(reached, key=lambda t: (dist[t], t))
        chain = [best]
        while chain[-1] != entry:
            chain.append(parent[chain[-1]])
        chain.reverse()
        out["path"] = [
            {
                "function": g.label(k),
                "file": modules[g.funcs[k].module].rel,
                "line": g.funcs[k].node.lineno,
                "via": g.edges[prev][k] if prev else "entry",
            }
            for prev, k in zip([None, *chain[:-1]], chain, strict=True)
        ]
        out["functions_on_path"] = len(chain)
    for n in range(depth + 1):
        within = [k for k, d in dist.items() if d <= n]
        out["reach"].append(
            {
                "depth": n,
                "functions": len(within),
                "modules": len({g.funcs[k].module for k in within}),
            }
        )
    return out


# -- the report ------------------------------------------------------------------------------------


def analyze(root: Path, depth: int = DEFAULT_DEPTH) -> dict[str, Any]:
    modules = discover(root)
    funcs, _ = _index(modules)
    edges = import_edges(modules)
    return {
        "root": str(root),
        "totals": {"modules": len(modules), "lines": sum(m.lines for m in modules.values())},
        "rooms": rooms(modules),
        "largest_functions": largest_functions(modules, funcs),
        "private_access": private_summary(private_accesses(modules)),
        "import_edges": {
            k: sum(1 for e in edges if e.kind == k) for k in ("eager", "lazy", "typing")
        },
        "import_cycles": import_cycles(edges),
        "rules": rule_violations(edges, modules),
        "submission": submission_depth(modules, depth),
    }


def render(r: dict[str, Any]) -> str:
    lines: list[str] = []
    w = lines.append
    t = r["totals"]
    w(f"Architecture report of {r['root']}: {t['modules']} modules, {t['lines']} non-blank lines")
    w("")
    w("1. Rooms (directories holding .py files)")
    w(f"   {'room':<36}{'modules':>8}{'lines':>8}")
    for row in r["rooms"]:
        w(f"   {row['room']:<36}{row['modules']:>8}{row['lines']:>8}")
    w("")
    w(f"2. Largest functions (line span, top {TOP})")
    for row in r["largest_functions"]:
        w(f"   {row['lines']:>5}  {row['function']}  ({row['file']}:{row['line']})")
    w("")
    p = r["private_access"]
    cats = ", ".join(f"{k} {v}" for k, v in p["by_category"].items()) or "none"
    w(f"3. Private accesses: {p['total']} in {p['files']} files ({cats})")
    w(f"   of which {p['own_name']} to a name their own module also defines (likely its own)")
    for f, n in p["per_file"].items():
        w(f"   {n:>5}  {f}")
    w("   top names: " + ", ".join(f"{f} {n}" for f, n in p["top_names"]))
    w("")
    c = r["import_cycles"]
    ek = r["import_edges"]
    w(
        f"4. Import cycles (module edges: eager {ek['eager']}, lazy {ek['lazy']}, "
        f"typing {ek['typing']})"
    )
    for label in ("eager", "eager+lazy", "all (with TYPE_CHECKING)"):
        w(f"   {label}: {len(c[label])} cycle(s)")
        for scc in c[label]:
            w(f"     [{len(scc)}] " + ", ".join(scc))
    w("")
    rules = r["rules"]
    w(f"5. Cross-room rules: {len(rules['violations'])} violation(s)")
    for v in rules["violations"]:
        w(f"   - {v}")
    imp = rules["service_importers"]
    w(f"   modules importing orchestrator.service: {len(imp)}")
    for mod, kinds in imp.items():
        w(f"     {mod} ({', '.join(kinds)})")
    w("")
    s = r["submission"]
    w("6. Submission call depth (STATIC ESTIMATE: calls resolved by name, see the docstring)")
    w(f"   entry: {s['entry']} (found by {s['entry_found_by']})")
    w(f"   targets (build a CommitCommand): {', '.join(s['targets']) or 'none'}")
    if s["functions_on_path"] is None:
        w("   no static path from the entry to a target")
    else:
        w(f"   shortest path: {s['functions_on_path']} distinct functions")
        for step in s["path"]:
            w(f"     [{step['via']}] {step['function']}  ({step['file']}:{step['line']})")
    for row in s["reach"]:
        w(
            f"   reachable within depth {row['depth']}: {row['functions']} functions "
            f"in {row['modules']} modules"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parents[1],
        help="the project root holding the product packages (default: this checkout)",
    )
    ap.add_argument(
        "--depth",
        type=int,
        default=DEFAULT_DEPTH,
        help=f"call depth for the submission's reach (default {DEFAULT_DEPTH})",
    )
    args = ap.parse_args(argv)
    if not any((args.root / pkg).is_dir() for pkg in PRODUCT_PACKAGES):
        ap.error(f"{args.root} holds none of the product packages {', '.join(PRODUCT_PACKAGES)}")
    report = analyze(args.root.resolve(), args.depth)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
