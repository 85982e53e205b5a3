"""The import rules between this repository's packages, and the size limits of their code,
checked on the source.

Every ``.py`` of every package is parsed with :mod:`ast`; every ``import`` / ``from ... import``
counts, at any depth (lazy imports inside functions too), except under ``if TYPE_CHECKING:``.
Relative imports are resolved to absolute module names.

A *unit* is a top-level package, except that the ``seq`` CLI (``seq/cli*``, ``seq/_cli_*``,
``seq/__main__.py``) is its own unit ``seq.cli``: authoring code imports only the engine
(``seq.gateway_client`` resolves the gateway URL, key and data dir as the engine does), the CLI
that drives a server may import it.

Rules (the "may import (ours)" column of docs/design.md's package table, checked below):

* a unit imports, from other units, only what :data:`RULES` lists for it. An entry ``P`` allows
  module ``P`` and its submodules that belong to the same unit as ``P`` (``seq`` allows ``seq`` and
  ``seq.spec``, not ``seq.cli``);
* no module whose path has a private segment (``_x``) and no private name is imported across a
  top-level package boundary;
* the units have no import cycle (neither the rules nor the code).

:data:`ALLOWED` lists the violations that remain in files whose rework is under way elsewhere;
each names its file. It can only shrink: an entry that no longer occurs fails the test too.

Sizes: no module of a package is over :data:`MAX_MODULE_LINES` lines and no function (method,
nested function) over :data:`MAX_FUNCTION_LINES` lines, decorators to last line, docstring
included. :data:`OVERSIZE` names the modules and functions over a limit today, in files being
split elsewhere; it only shrinks, as ALLOWED does.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: top-level package -> its source directory
PACKAGES = {
    "sequence_ai_core": REPO / "sequence_ai_core",
    "sequence_ai": REPO / "sequence_ai",
    "seq": REPO / "seq",
    "sequence_ai_server": REPO / "server" / "sequence_ai_server",
    "sequence_ai_data": REPO / "sequence_ai_data",
    "sequence_ai_sim": REPO / "sequence_ai_sim",
    "sequence_ai_eval": REPO / "sequence_ai_eval",
    "sequence_ai_ros": REPO / "sequence_ai_ros",
    "sequence_ai_mcp": REPO / "sequence_ai_mcp",
}

#: unit -> what it may import from other units
RULES = {
    "sequence_ai_core": set(),
    "sequence_ai": {"sequence_ai_core"},
    "seq": {"sequence_ai_core"},
    "seq.cli": {"seq", "sequence_ai", "sequence_ai_core", "sequence_ai_server", "sequence_ai_eval", "sequence_ai_data"},
    "sequence_ai_server": {"sequence_ai_core.protocol", "sequence_ai_core.framing", "seq", "seq.spec", "sequence_ai_data"},
    "sequence_ai_data": set(),
    "sequence_ai_sim": {"seq"},
    "sequence_ai_eval": {"sequence_ai", "seq.spec", "sequence_ai_sim", "sequence_ai_data"},
    "sequence_ai_ros": {"sequence_ai", "sequence_ai_data", "sequence_ai_sim"},
    # the MCP server: Python mode drives sequence_ai against the simulated cell; only its --ros
    # module (sequence_ai_mcp/ros.py) imports sequence_ai_ros, lazily
    "sequence_ai_mcp": {"sequence_ai", "sequence_ai_sim", "sequence_ai_ros"},
}

#: (importing file, imported module or module.name) pairs that break a rule today, in files being
#: reworked in parallel; remove an entry when its file stops doing it.
ALLOWED: set = set()


def unit_of(module: str) -> str:
    """The unit a module belongs to (see the module docstring)."""
    parts = module.split(".")
    if parts[0] == "seq" and len(parts) > 1 and (parts[1] == "cli" or parts[1].startswith("_cli_")
                                                 or parts[1] == "__main__"):
        return "seq.cli"
    return parts[0]


def _module_name(package: str, root: Path, path: Path) -> str:
    rel = path.relative_to(root).with_suffix("").parts
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join((package, *rel))


@functools.lru_cache(maxsize=None)
def _source(path: Path) -> tuple:
    """``(text, syntax tree)`` of ``path``, read and parsed once per run: every check walks the
    same files, and parsing them all took most of this module's ~7 s."""
    text = path.read_text(encoding="utf-8")
    return text, ast.parse(text, str(path))


@functools.lru_cache(maxsize=None)
def _is_module(name: str) -> bool:
    parts = name.split(".")
    root = PACKAGES.get(parts[0])
    if root is None:
        return False
    base = root.joinpath(*parts[1:])
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _type_checking_nodes(tree: ast.AST) -> set:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skip.update(id(n) for n in ast.walk(child))
    return skip


def imports_of(path: Path, module: str, is_package: bool):
    """``(lineno, target)`` for each import in ``path``: ``target`` is the imported module, or
    ``module.name`` for ``from module import name`` where ``name`` is not a module of ours."""
    tree = _source(path)[1]
    skip = _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                yield node.lineno, sub if (alias.name == "*" or _is_module(sub) or alias.name.startswith("_")) \
                    else source


@functools.lru_cache(maxsize=None)
def _all_imports() -> tuple:
    """Every import of ours that crosses a unit: ``(file, lineno, importer unit, target)``."""
    found = []
    for package, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            if "templates" in path.relative_to(root).parts:
                continue   # `seq init` templates: user code copied out, not part of the package
            module = _module_name(package, root, path)
            src_unit = unit_of(module)
            for lineno, target in imports_of(path, module, path.name == "__init__.py"):
                if target.split(".")[0] not in PACKAGES or unit_of(target) == src_unit:
                    continue
                found.append((path.relative_to(REPO).as_posix(), lineno, src_unit, target))
    return tuple(found)


def _allowed_by_rules(src_unit: str, target: str) -> bool:
    for entry in RULES[src_unit]:
        if (target == entry or target.startswith(entry + ".")) and unit_of(target) == unit_of(entry):
            return True
    return False


def _private(src_unit: str, target: str) -> bool:
    same_package = src_unit.split(".")[0] == target.split(".")[0]
    return not same_package and any(p.startswith("_") and not p.startswith("__") for p in target.split(".")[1:])


def violations():
    """``{(file, target): [lines]}`` of every import that breaks a rule."""
    out: dict = {}
    for file, lineno, src_unit, target in _all_imports():
        if not _allowed_by_rules(src_unit, target) or _private(src_unit, target):
            lines = out.setdefault((file, target), [])
            if lineno not in lines:
                lines.append(lineno)
    return out


def _edges():
    """Unit -> unit import edges of the code, less the ALLOWED ones (they are being removed)."""
    return {(src, unit_of(t)) for f, _, src, t in _all_imports() if (f, t) not in ALLOWED}


def _cycle(edges) -> list:
    graph: dict = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    state: dict = {}

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [node, nxt] if nxt in stack else [node, nxt]
            if nxt not in state:
                found = visit(nxt, stack + [node])
                if found:
                    return found
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return []


def test_every_package_is_scanned():
    """The scan sees every package's files (a moved or renamed directory cannot silently vanish)."""
    for package, root in PACKAGES.items():
        assert (root / "__init__.py").is_file(), f"{package}: no {root / '__init__.py'}"
    assert set(RULES) == set(PACKAGES) | {"seq.cli"}
    files = {f for f, *_ in _all_imports()}
    assert "sequence_ai_ros/driver/node.py" in files   # imports sequence_ai lazily or not: it is seen
    assert "server/sequence_ai_server/gateway/capture_export.py" in files   # imports sequence_ai_data


def test_imports_follow_the_rules():
    found = violations()
    new = {k: v for k, v in found.items() if k not in ALLOWED}
    assert not new, "imports that break the layering (file, module): lines\n" + "\n".join(
        f"  {f} -> {t}: lines {lines}  (may import: {sorted(RULES[unit_of(_module_of(f))]) or 'nothing of ours'})"
        for (f, t), lines in sorted(new.items()))


def _module_of(file: str) -> str:
    path = REPO / file
    for package, root in PACKAGES.items():
        if root in path.parents:
            return _module_name(package, root, path)
    raise AssertionError(file)


def test_allowed_list_only_shrinks():
    """Every ALLOWED entry still occurs; one that no longer does must be removed from the list."""
    found = violations()
    stale = sorted(k for k in ALLOWED if k not in found)
    assert not stale, f"ALLOWED entries that no longer occur (remove them): {stale}"


def test_no_cycles():
    assert _cycle({(a, b) for a, bs in RULES.items() for b in (unit_of(e) for e in bs)}) == []
    assert _cycle(_edges()) == [], "the packages import each other in a cycle"


def test_checker_sees_lazy_relative_and_private_imports(tmp_path):
    """The checker itself: a lazy import in a function, a relative import and a private name are
    all found, and a private module across packages is flagged while one inside is not."""
    src = tmp_path / "m.py"
    src.write_text("def f():\n    import sequence_ai_server.gateway\n    from ..bag import frames\n"
                   "    from seq import _policy\n")
    got = [t for _, t in imports_of(src, "sequence_ai_ros.demo.m", False)]
    assert got == ["sequence_ai_server.gateway", "sequence_ai_ros.bag.frames", "seq._policy"]
    assert not _allowed_by_rules("sequence_ai_ros", "sequence_ai_server.gateway")
    assert _allowed_by_rules("sequence_ai_server", "seq.spec")
    assert not _allowed_by_rules("sequence_ai_server", "seq.cli")
    assert _private("sequence_ai_server", "seq._policy") and not _private("seq.cli", "seq._policy")
    assert _cycle({("a", "b"), ("b", "c"), ("c", "a")})


def _design_table() -> dict:
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    section = text.split("## Packages", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    name_col, may_col = header.index("import name"), header.index("may import (ours)")
    table = {}
    for row in rows[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        names = re.findall(r"`([^`]+)`", cells[name_col]) or [cells[name_col]]
        table[names[0]] = set(re.findall(r"`([A-Za-z_][\w.]*)`", cells[may_col]))
    return table


def test_design_table_matches_the_rules():
    """docs/design.md's package table says the same "may import (ours)" as RULES, row by row."""
    table = _design_table()
    for unit, allowed in RULES.items():
        assert unit in table, f"docs/design.md's package table has no row for {unit}"
        assert table[unit] == allowed, f"docs/design.md says {unit} may import {sorted(table[unit])}; " \
                                       f"the rules say {sorted(allowed)}"


#: Modules RULES names that work under way creates (none now); an entry here that exists
#: fails the test: remove it then.
PENDING: set = set()


@pytest.mark.parametrize("unit", sorted(RULES))
def test_rules_name_real_modules(unit):
    for entry in RULES[unit]:
        if entry in PENDING:
            assert not _is_module(entry), f"{entry} exists now: remove it from PENDING"
        else:
            assert _is_module(entry), f"RULES[{unit!r}] names {entry}, which is not a module here"


def test_bag_command_joins_the_client_cli_by_entry_point():
    """``sequence-ai bag`` is found through the ``sequence_ai.commands`` entry point (so the
    client's CLI never imports sequence_ai_ros), and the bag CLI's help comes back through it."""
    import subprocess
    import sys

    from sequence_ai import cli

    plugins = cli._plugin_commands()
    assert plugins["bag"].value == "sequence_ai_ros.bag.cli:main"
    code = ("import sys; from sequence_ai.cli import main; rc = main(['version']); "
            "print('ros' if 'sequence_ai_ros' in sys.modules else 'no-ros'); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split()[-1] == "no-ros", out.stdout + out.stderr
    out = subprocess.run([sys.executable, "-m", "sequence_ai", "bag", "export", "-h"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "--out" in out.stdout, out.stdout + out.stderr


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

#: ``file`` (a module over MAX_MODULE_LINES) or ``file::qualified.name`` (a function over
#: MAX_FUNCTION_LINES) that are over a limit today, in files being split in parallel; remove an
#: entry when it fits.
OVERSIZE: set = set()


def _functions(tree: ast.AST, prefix: str = ""):
    """``(qualified name, first line, last line)`` of every function in ``tree``, nested ones too
    (first line: its first decorator's)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                yield name, first, node.end_lineno
            yield from _functions(node, name + ".")
        else:
            yield from _functions(node, prefix)


def oversize() -> dict:
    """``{file or file::function: lines}`` of every module and function over its limit."""
    found = {}
    for root in PACKAGES.values():
        for path in sorted(root.rglob("*.py")):
            if "templates" in path.relative_to(root).parts:
                continue
            file = path.relative_to(REPO).as_posix()
            text, tree = _source(path)
            lines = len(text.splitlines())
            if lines > MAX_MODULE_LINES:
                found[file] = lines
            for name, first, last in _functions(tree):
                if last - first + 1 > MAX_FUNCTION_LINES:
                    found[f"{file}::{name}"] = last - first + 1
    return found


def test_no_module_or_function_over_its_size_limit():
    new = {k: v for k, v in oversize().items() if k not in OVERSIZE}
    assert not new, (f"over the limits ({MAX_MODULE_LINES} lines a module, {MAX_FUNCTION_LINES} a function); "
                     "split by concept:\n" + "\n".join(f"  {k}: {v} lines" for k, v in sorted(new.items())))


def test_oversize_list_only_shrinks():
    stale = sorted(OVERSIZE - set(oversize()))
    assert not stale, f"OVERSIZE entries that fit now (remove them): {stale}"


def test_size_checker_counts_nested_functions_and_decorators(tmp_path):
    src = "class A:\n    @staticmethod\n    def f():\n        def g():\n            return 1\n        return g\n"
    got = list(_functions(ast.parse(src)))
    assert got == [("A.f", 2, 6), ("A.f.g", 4, 5)]


# --- the server's planes -------------------------------------------------------------------------

SERVER = PACKAGES["sequence_ai_server"]

#: The server's planes, lowest first: a module may import the server's modules of its own plane
#: and of the planes before it, never one after it (the worker never imports the launchers, ops
#: or the gateway; the launchers never import ops or the gateway; ops never imports the gateway).
#: ``sequence_ai_server/__init__.py`` belongs to no plane and imports none.
PLANES = ("common", "worker", "launchers", "ops", "gateway")

#: (importing file, imported module) pairs that cross a plane upward today, in files being
#: reworked in parallel; it only shrinks, as ALLOWED does.
PLANE_ALLOWED: set = set()


def _plane(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "sequence_ai_server" else ""


def plane_violations() -> dict:
    """``{(file, target): [lines]}`` of every server import that reaches a later plane."""
    out: dict = {}
    for path in sorted(SERVER.rglob("*.py")):
        module = _module_name("sequence_ai_server", SERVER, path)
        plane = _plane(module)
        for lineno, target in imports_of(path, module, path.name == "__init__.py"):
            if not target.startswith("sequence_ai_server"):
                continue
            tplane = _plane(target)
            if tplane not in PLANES:
                continue
            if plane not in PLANES or PLANES.index(tplane) > PLANES.index(plane):
                out.setdefault((path.relative_to(REPO).as_posix(), target), []).append(lineno)
    return out


def test_every_server_module_is_in_a_plane():
    loose = [p.relative_to(SERVER).as_posix() for p in SERVER.rglob("*.py")
             if _plane(_module_name("sequence_ai_server", SERVER, p)) not in PLANES and p.name != "__init__.py"]
    assert not loose, f"server modules outside the planes {PLANES}: {loose}"
    assert sorted(p.name for p in SERVER.iterdir() if p.is_dir() and (p / "__init__.py").is_file()) \
        == sorted(PLANES)


def test_no_server_import_reaches_a_later_plane():
    new = {k: v for k, v in plane_violations().items() if k not in PLANE_ALLOWED}
    assert not new, f"imports against the planes {' < '.join(PLANES)} (file, module): lines\n" + "\n".join(
        f"  {f} -> {t}: lines {lines}" for (f, t), lines in sorted(new.items()))


def test_plane_allowed_list_only_shrinks():
    stale = sorted(k for k in PLANE_ALLOWED if k not in plane_violations())
    assert not stale, f"PLANE_ALLOWED entries that no longer occur (remove them): {stale}"


# --- class size ----------------------------------------------------------------------------------

#: The most methods a class of ours may have, counting those it inherits from our own classes
#: (so that splitting a class into mixins in several files cannot stand in for splitting it).
MAX_CLASS_METHODS = 30

#: ``file::Class`` over MAX_CLASS_METHODS today, being split in parallel; it only shrinks.
OVERSIZE_CLASSES: set = set()


def _classes():
    """``{name: [(file, ClassDef)]}`` of every class in every package."""
    found: dict = {}
    for root in PACKAGES.values():
        for path in sorted(root.rglob("*.py")):
            if "templates" in path.relative_to(root).parts:
                continue
            for node in ast.walk(_source(path)[1]):
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append((path.relative_to(REPO).as_posix(), node))
    return found


def _base_name(expr: ast.expr) -> str:
    return expr.attr if isinstance(expr, ast.Attribute) else getattr(expr, "id", "")


def class_methods() -> dict:
    """``{file::Class: number of methods}``: its own and those of every base class of ours, by name
    (an ambiguous base name counts the largest class of that name)."""
    classes = _classes()

    def methods(node: ast.ClassDef, seen: frozenset) -> set:
        own = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for base in node.bases:
            name = _base_name(base)
            if name in classes and name not in seen:
                own |= max((methods(b, seen | {name}) for _, b in classes[name]), key=len)
        return own

    return {f"{file}::{node.name}": len(methods(node, frozenset({node.name})))
            for name, defs in classes.items() for file, node in defs}


def test_no_class_over_its_method_limit():
    over = {k: v for k, v in class_methods().items() if v > MAX_CLASS_METHODS and k not in OVERSIZE_CLASSES}
    assert not over, (f"classes over {MAX_CLASS_METHODS} methods (inherited ones of ours included); "
                      "split the object, not the file:\n" + "\n".join(f"  {k}: {v}" for k, v in sorted(over.items())))


def test_oversize_classes_list_only_shrinks():
    counts = class_methods()
    stale = sorted(k for k in OVERSIZE_CLASSES if counts.get(k, 0) <= MAX_CLASS_METHODS)
    assert not stale, f"OVERSIZE_CLASSES entries that fit now (remove them): {stale}"


def test_class_counter_counts_inherited_methods(monkeypatch):
    tree = ast.parse("class A:\n    def a(self): ...\n    def b(self): ...\nclass B(A):\n    def c(self): ...\n")
    a, b = [n for n in tree.body]
    monkeypatch.setitem(globals(), "_classes", lambda: {"A": [("m.py", a)], "B": [("m.py", b)]})
    assert class_methods() == {"m.py::A": 2, "m.py::B": 3}
