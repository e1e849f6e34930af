"""No import cycle between vlservice's modules: every import statement (at module level, inside a
function, under `if TYPE_CHECKING:`) read from the source with `ast`, relative ones resolved."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "vlservice"


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, from `__init__.py`)."""
    out = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports anywhere in its source. `from X import y` is an
    import of `X.y` when that is a module, else of `X`; a parent package's `__init__` that Python
    runs on the way is not counted (importing it from a submodule is not a cycle)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[:len(base) - node.level + 1]
                base += node.module.split(".") if node.module else []
            else:
                base = (node.module or "").split(".")
            mod = ".".join(base)
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_resolver_reads_relative_and_function_level_imports():
    mods = modules()
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    assert "vlservice.engine.batching.scheduler" in graph["vlservice.engine.service"]  # from .scheduler import Scheduler
    assert "vlservice.engine.model.quant" in graph["vlservice.engine.service"]  # inside a method
    assert "vlservice.config" in graph["vlservice.engine.service"]  # from ..config import Settings
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_between_vlservice_modules():
    mods = modules()
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(
        " <-> ".join(c) + ": " + "; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(c)))}" for m in c)
        for c in found)


def test_the_scheduler_side_never_reaches_back_to_the_service():
    """A request's path runs one way: the service submits a `Generation` to the scheduler, which
    works with what it was built with and publishes to that `Generation`. No module on the model's
    side imports the service or names it (no `self.service`, no `gen.service`)."""
    mods = modules()
    known = set(mods)
    side = [m for m in mods if m.startswith(("vlservice.engine.batching", "vlservice.engine.output",
                                              "vlservice.engine.model", "vlservice.engine.media"))]
    assert "vlservice.engine.batching.scheduler" in side and "vlservice.engine.media.features" in side
    for mod in side:
        path = mods[mod]
        assert "vlservice.engine.service" not in imports(mod, path, known), mod
        tree = ast.parse(path.read_text())
        named = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | \
                {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
                {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs}
        assert not named & {"service", "svc"}, f"{mod} names the service"


# Who may import whom, by top-level part of the package: a part imports only the parts listed
# for it (and itself); everything above the line a request crosses (http -> protocol -> engine)
# looks down only, and the offline parts (build < demo < tools) never reach back into each other.
BELOW = {
    "config": set(), "errors": set(), "allocator": set(), "obs": {"config", "errors"},
    "build": {"config", "errors", "obs"},
    "engine": {"config", "errors", "allocator", "obs"},
    "protocol": {"config", "errors", "engine"},
    "http": {"config", "errors", "allocator", "obs", "engine", "protocol"},
    "demo": {"config", "errors", "obs", "build", "engine"},
    "tools": {"config", "errors", "allocator", "obs", "build", "engine", "protocol", "http", "demo"},
}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_each_layer_imports_only_the_layers_below_it():
    mods = modules()
    known = set(mods)
    wrong = []
    for name, path in mods.items():
        part = _part(name)
        if part not in BELOW:
            continue
        for target in imports(name, path, known):
            other = _part(target)
            if other in BELOW and other != part and other not in BELOW[part]:
                wrong.append(f"{name} -> {target}")
    assert not wrong, "imports up or across the layers:\n" + "\n".join(sorted(wrong))


def test_the_protocol_reaches_the_engine_through_its_one_seam():
    """`vlservice.protocol` uses the engine's request types, media probes and grammar compiler
    through `vlservice.engine.interface` only."""
    mods = modules()
    known = set(mods)
    reached = {t for name, path in mods.items() if _part(name) == "protocol"
               for t in imports(name, path, known) if _part(t) == "engine"}
    assert reached <= {"vlservice.engine", "vlservice.engine.interface"}, sorted(reached)
