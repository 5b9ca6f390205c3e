"""Every import points down the layers of docs/architecture.md, and no two packages import each
other, however indirectly.

The layers, lowest first. A module may import its own package and any package of a lower
layer; packages of one layer may import one another, as long as no cycle forms. Imports under
``if TYPE_CHECKING:`` are annotations, not arrows, and are not counted.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import ortserve

SOURCE = Path(ortserve.__file__).parent

LAYERS: tuple[tuple[str, ...], ...] = (
    # the foundation: errors, settings, logging, the package's version
    ("ortserve", "errors", "settings", "trace_settings", "ort_runtime", "logs", "log_settings"),
    # per-model schemas (config.yaml), importing no feature package
    ("config",),
    # types, DataPlane, scheduler, runner, sessions; the protocols it calls on features
    ("core",),
    # what the core runs or reports: resilience levels, the generation engine, metrics
    ("resilience", "llm", "metrics", "statistics", "tracing", "lifecycle_metrics", "gc_pauses", "tenancy"),
    # wire formats; per-request accounting
    ("protocol", "telemetry"),
    # traffic capture (records requests in their HTTP form)
    ("capture_records", "capture", "capture_redaction"),
    # traffic policies and pipelines over served models
    ("routing", "pipeline"),
    # the model repository: layout, versions, registry, lifecycle manager
    ("repository",),
    # applications and tools built on the repository
    ("apps", "quantization", "loadtest", "demo", "testing", "pipeline_harness", "dashboards"),
    # the transports and the one request edge
    ("server",),
    # processes above the server
    ("supervisor",),
    ("cli", "__main__"),
)
LAYER = {name: index for index, names in enumerate(LAYERS) for name in names}
UNPLACED = LAYER["server"] - 1
"""A package not placed above sits with the tools, just below the server: it may import any
lower layer, and only the server and above may import it (place it when something lower must)."""


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ortserve"


def _runtime_imports(tree: ast.Module) -> list[str]:
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    found: list[str] = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return [name for name in found if name == "ortserve" or name.startswith("ortserve.")]


def _arrows() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> the importing modules."""
    arrows: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(SOURCE.rglob("*.py")):
        relative = path.relative_to(SOURCE.parent).with_suffix("")
        module = ".".join(relative.parts).removesuffix(".__init__")
        for imported in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            source, target = _package(module), _package(imported)
            if source != target:
                arrows[(source, target)].append(module)
    return arrows


def test_no_import_points_up() -> None:
    upward = {
        f"{source} -> {target}": sorted(set(modules))
        for (source, target), modules in _arrows().items()
        if LAYER.get(source, UNPLACED) < LAYER.get(target, UNPLACED)
    }
    assert upward == {}


def test_no_package_level_cycle() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in _arrows():
        graph[source].add(target)
    cycles = [component for component in _strongly_connected(graph) if len(component) > 1]
    assert cycles == []


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(sorted(component))

    for node in sorted(set(graph) | {t for targets in graph.values() for t in targets}):
        if node not in index:
            visit(node)
    return components
