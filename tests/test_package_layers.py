"""The package's import graph: every import between modules points down the layer order, no cycles, and
no module takes a private name from another."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "nanoexp"
# lower index = lower layer; a module may import its own layer and the ones below it
LAYERS = [
    "config",
    "kernels",
    "distributed",
    "layers",
    "models",
    "loader",
    "runner",
    "engine",
    "factory",
    "experiment",
]
# the experiment layer's own folders, in the same sense: each may import its own and the ones before it
EXPERIMENT_LAYERS = ["metrics", "schema", "runtime", "measure", "sinks", "report", "launch", "job"]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """nanoexp modules imported anywhere in the file (function-level imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import mod` imports pkg.mod; `from pkg import name` imports pkg
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                for a in node.names
            ]
        found |= {n for n in names if n in known}
    return found


@functools.cache  # parsed once for all the tests below (none changes it)
def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imported_modules(path, set(files)) - {name} for name, path in files.items()}


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def experiment_layer_of(module: str) -> int | None:
    parts = module.split(".")
    inside = len(parts) > 2 and parts[1] == "experiment" and parts[2] in EXPERIMENT_LAYERS
    return EXPERIMENT_LAYERS.index(parts[2]) if inside else None


def test_every_module_belongs_to_a_layer() -> None:
    stray = [m for m in import_graph() if m != "nanoexp" and layer_of(m) is None]
    assert not stray, f"modules outside the layer order {LAYERS}: {stray}"


def test_imports_point_down() -> None:
    upward = [
        f"{src} -> {dst}"
        for src, targets in import_graph().items()
        for dst in targets
        if src != "nanoexp" and dst != "nanoexp" and layer_of(dst) > layer_of(src)
    ]
    assert not upward, "imports that point up the layers:\n" + "\n".join(sorted(upward))


# old `python -m` spellings, kept for one release: each warns and runs the module that moved
DEPRECATED_ENTRY_POINTS = {"nanoexp.experiment.compare", "nanoexp.experiment.sweep_report"}


def test_experiment_modules_sit_in_its_folders() -> None:
    inside = [m for m in import_graph() if m.startswith("nanoexp.experiment.")]
    stray = [m for m in inside if experiment_layer_of(m) is None and m not in DEPRECATED_ENTRY_POINTS]
    assert not stray, f"experiment modules outside its folders {EXPERIMENT_LAYERS}: {stray}"


def test_experiment_imports_point_down() -> None:
    upward = [
        f"{src} -> {dst}"
        for src, targets in import_graph().items()
        for dst in targets
        if None not in (experiment_layer_of(src), experiment_layer_of(dst))
        and experiment_layer_of(dst) > experiment_layer_of(src)
    ]
    assert not upward, "experiment imports that point up its folders:\n" + "\n".join(sorted(upward))


# the schema's own modules: the shared ones, then one per config group (each imports only the shared ones),
# then the root that composes the groups, then the registration with Hydra (the package imports them all)
SCHEMA = "nanoexp.experiment.schema"
SCHEMA_SHARED = {"common", "keys", "job_dirs"}
SCHEMA_LAYERS = {"experiment": 2, "store": 3}  # any other module: a config group's, layer 1


def schema_layer_of(module: str) -> int | None:
    inside = module.startswith(SCHEMA + ".") and module.count(".") == SCHEMA.count(".") + 1
    name = module.rsplit(".", 1)[-1]
    return None if not inside else 0 if name in SCHEMA_SHARED else SCHEMA_LAYERS.get(name, 1)


def test_schema_groups_import_only_the_shared_schema_modules() -> None:
    crossing = [
        f"{src} -> {dst}"
        for src, targets in import_graph().items()
        for dst in targets
        if None not in (schema_layer_of(src), schema_layer_of(dst))
        and schema_layer_of(dst) >= schema_layer_of(src) > 0
    ]
    assert not crossing, "schema modules that import a group's or a later module:\n" + "\n".join(
        sorted(crossing)
    )


def test_only_the_public_api_imports_the_package_root() -> None:
    importers = [src for src, targets in import_graph().items() if "nanoexp" in targets]
    assert not importers, f"import nanoexp.<layer> modules directly, not the package root: {importers}"


def test_no_import_cycles() -> None:
    graph = import_graph()
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    pytest.fail("import cycle: " + " -> ".join(path + [start]))
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))


def is_private(dotted: str) -> bool:
    """A leading underscore on any part of the name (dunders such as __version__ are public)."""
    return any(part.startswith("_") and not part.endswith("__") for part in dotted.split("."))


def private_imports(path: Path, modules: set[str]) -> list[str]:
    """Leading-underscore names this file takes from other nanoexp modules: imported by name, a private
    module, or read as an attribute of an imported module (`mod._name`)."""
    tree, found, imported_modules = ast.parse(path.read_text()), [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("nanoexp"):
                    found += [alias.name] if is_private(alias.name) else []
                    imported_modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("nanoexp")):
            source = node.module or ""
            found += [f"{source}.{a.name}" for a in node.names if is_private(f"{source}.{a.name}")]
            imported_modules |= {a.asname or a.name for a in node.names if f"{source}.{a.name}" in modules}
    found += [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and is_private(node.attr)
        and ast.unparse(node.value) in imported_modules
    ]
    return found


def test_no_module_imports_another_modules_private_name() -> None:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    found = [f"{name}: {n}" for name, path in files.items() for n in private_imports(path, set(files))]
    assert not found, "private names used across modules (make them public where they belong):\n" + "\n".join(
        sorted(found)
    )
