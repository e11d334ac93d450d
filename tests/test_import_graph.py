"""The architecture, read from the source: layers import only downwards (format < store < columnar < ops
< cli/spark), no import cycles (lazy imports inside functions count), and no store path is spelled
outside ``rmqtool/store/`` (operations ask ``Store`` and ``rmqtool.store.layout``)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rmqtool"
# clock sits above format: the codecs are pure (a rule that needs the time is given it)
LAYERS = {"constants": 0, "errors": 0, "format": 1, "clock": 1.5, "store": 2, "columnar": 3, "ops": 4, "cli": 5,
          "spark": 5, "__main__": 6, "_manpages": 6}
STORE_NAMES = {"commitlog", "consumequeue", "consumequeue_ext", "batchconsumequeue", "index", "checkpoint",
               "abort", "abort.bak", "lock", "config", "compaction", "timerlog", "timerwheel", "currterm", "data"}


def modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = ast.parse(path.read_text("utf-8"), str(path))
    return out


def imports(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """The rmqtool modules ``name`` imports anywhere in its body (``from pkg import mod`` names mod). A
    package importing its own submodules (the CLI's commands registering on its group) is not counted."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("rmqtool")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rmqtool"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in known else node.module)
    return {m for m in out if m != name and not m.startswith(name + ".")}


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, tree, set(mods)) for name, tree in mods.items()}


def test_nothing_imports_upward():
    upward = [f"{a} -> {b}" for a, deps in graph().items() for b in deps
              if layer(a) is not None and layer(b) is not None and layer(b) > layer(a)]
    assert upward == []


def test_no_import_cycles():
    g = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:             # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in g.get(v, ()):
            if w not in g:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    assert cycles == []


def _spelled_paths(tree: ast.Module) -> list[int]:
    """Lines where a store path is spelled: ``x / "commitlog"``, ``Path(x, "index")``, ``join(x, "config")``,
    ``"consumequeue/..."`` or ``f"index/{name}"``, or a ``"dledger-"`` prefix."""
    def is_store(text) -> bool:            # a message or docstring (with spaces) only names a path
        return isinstance(text, str) and " " not in text and (
            text.split("/")[0] in STORE_NAMES and ("/" in text or bare) or text.startswith("dledger-"))

    lines = []
    for node in ast.walk(tree):
        bare = True
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            operands = [node.left, node.right]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                "Path", "join", "joinpath", "PurePosixPath"):
            operands = node.args
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            bare, operands = False, [node.values[0]]
        elif isinstance(node, ast.Constant):
            bare, operands = False, [node]
        else:
            continue
        if any(isinstance(o, ast.Constant) and is_store(o.value) for o in operands):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_no_store_path_outside_store():
    spelled = {name: lines for name, tree in modules().items()
               if not name.startswith("rmqtool.store") and (lines := _spelled_paths(tree))}
    assert spelled == {}


def test_the_checks_see_what_they_look_for():
    """The detectors find the patterns they are meant to find (so a green run means something)."""
    tree = ast.parse('p = root / "commitlog"\nq = f"index/{n}"\nr = Path(root, "consumequeue", t)\n'
                     's = "config/topics.json"\nu = root / ("dledger-" + n)\nv = {"checkpoint": 1}\n'
                     'w = f"no config/{n} here"')
    assert _spelled_paths(tree) == [1, 2, 3, 4, 5]
    g = imports("rmqtool.ops.x", ast.parse("def f():\n    from rmqtool.store import layout\n"),
                {"rmqtool.store.layout"})
    assert g == {"rmqtool.store.layout"} and layer("rmqtool.store.layout") < layer("rmqtool.ops.x")


def _in_place_writes(tree: ast.Module) -> list[int]:
    """Lines that change a file's bytes in place: ``open`` in an update or append mode, a ``truncate``, or a
    ``mmap.mmap`` that is not read-only."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", None))
        mode = node.args[1] if name == "open" and len(node.args) > 1 else next(
            (k.value for k in node.keywords if k.arg == "mode"), None)
        if name == "truncate" or name == "open" and isinstance(mode, ast.Constant) and any(
                c in str(mode.value) for c in "+a"):
            lines.append(node.lineno)
        elif name == "mmap" and not any(k.arg == "access" and getattr(k.value, "attr", "") == "ACCESS_READ"
                                        for k in node.keywords):
            lines.append(node.lineno)
    return lines


def test_operations_change_no_bytes_in_place():
    """Operations plan and call store methods: writing into, truncating or mapping a file for writing is
    the store layer's (its transactions, writers and patched copies)."""
    found = {name: lines for name, tree in modules().items()
             if name.startswith("rmqtool.ops") and (lines := _in_place_writes(tree))}
    assert found == {}


def test_only_the_store_maps_files():
    """Files are mapped by the store layer (``map_file``, ``map_private``, the writers): nothing above it
    imports mmap."""
    found = sorted(name for name, tree in modules().items()
                   if (name.split(".") + [""])[1] not in ("format", "store") and any(
                       isinstance(node, ast.Import) and any(a.name == "mmap" for a in node.names)
                       or isinstance(node, ast.ImportFrom) and node.module == "mmap" for node in ast.walk(tree)))
    assert found == []
