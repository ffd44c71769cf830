"""The package's shape: no import cycles (function-level imports included), the training method
named in one place only, a small public surface that imports nothing heavy, errors that pickle."""

from __future__ import annotations

import ast
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sparkml_dist"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of nodes under `if TYPE_CHECKING:` (never executed, so never part of the import graph)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skip.update(id(n) for n in ast.walk(child))
    return skip


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules of the package that `name` imports anywhere in its file, plus each package whose
    __init__ that import runs (parents of the target that are not parents of the importer)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    targets: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                targets.add(full if full in modules else node.module)
    own_parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    edges = set()
    for target in targets:
        if not target.startswith("sparkml_dist"):
            continue
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            module = ".".join(parts[:i])
            if module in modules and module not in own_parents and module != name:
                edges.add(module)
    return edges


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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


def test_the_package_has_no_import_cycles_not_even_through_function_level_imports():
    modules = _modules()
    graph = {name: _imported(name, path, modules) for name, path in modules.items()}
    assert sum(len(e) for e in graph.values()) > 100, "the walker found the package's imports"
    assert _cycles(graph) == []


# The building blocks (lower) never import the jobs made of them (upper): a stage, the pipeline,
# the CLI, the workflow or the tuner. A task owns its metrics; the gate above it decides with them.
_UPPER = ("stages", "pipeline", "cli", "workflow", "tune")
_LOWER = (
    "config",
    "data",
    "inference",
    "launch",
    "models",
    "observe",
    "spark",
    "storage",
    "streaming",
    "tasks",
    "train",
)


def test_layers_point_one_way():
    modules = _modules()
    upward = []
    for name, path in modules.items():
        parts = name.split(".")
        if len(parts) < 2 or parts[1] not in _LOWER:
            continue
        above = _UPPER + (("validation",) if parts[1] == "tasks" else ())
        upward += [f"{name} -> {t}" for t in _imported(name, path, modules) if t.split(".")[1] in above]
    assert upward == []


# Libraries slow enough to import (or absent where the light paths run: a config read, the CLI's
# help, a serving environment without pyspark) that the package imports them only where used.
_HEAVY = {
    "numpy",
    "torch",
    "pyspark",
    "mlflow",
    "optuna",
    "matplotlib",
    "horovod",
    "opacus",
    "pandas",
    "pyarrow",
}


def _top_level_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """What a module imports when it is imported: module-level statements (class bodies and
    try/if blocks included; function bodies and `if TYPE_CHECKING:` not)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    found: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if id(node) in skip or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.update(_import_targets(node, modules))
            for block in ("body", "orelse", "finalbody"):
                visit([n for n in getattr(node, block, []) if isinstance(n, ast.stmt)])
            for handler in getattr(node, "handlers", []):
                visit(handler.body)

    visit(tree.body)
    return found


def _import_targets(node: ast.ImportFrom, modules: dict[str, Path]) -> set[str]:
    return {
        f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else str(node.module)
        for a in node.names
    }


def _runs(target: str, modules: dict[str, Path]) -> list[str]:
    """The package modules an import of `target` runs: it and every parent package's __init__."""
    parts = target.split(".")
    return [m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if m in modules]


def _heavy_closure(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the heavy libraries importing it imports (through the package's own modules)."""
    top = {name: _top_level_imports(path, modules) for name, path in modules.items()}
    memo: dict[str, set[str]] = {}

    def heavy(name: str, seen: frozenset[str]) -> set[str]:
        if name in memo:
            return memo[name]
        found: set[str] = set()
        for target in [*top[name], *_runs(name, modules)[:-1]]:  # its parents' __init__ run first
            if target.split(".")[0] in _HEAVY:
                found.add(target.split(".")[0])
            for module in _runs(target, modules) if target.startswith("sparkml_dist") else ():
                if module != name and module not in seen:
                    found |= heavy(module, seen | {name})
        memo[name] = found
        return found

    return {name: heavy(name, frozenset()) for name in modules}


def test_a_function_level_import_of_the_package_keeps_a_heavy_library_out():
    """An import of one of the package's own modules inside a function is there for one reason:
    the imported module brings a heavy library (`_HEAVY`) that its importer does not import at
    module level, and so stays out of a light path (reading a config, `import sparkml_dist`, a
    rank that needs no Spark). Its comment says which and why. Any other belongs at the top of
    the file, where a reader sees the dependency: the graph has no cycles (function-level imports
    counted), so it can move there."""
    modules = _modules()
    heavy = _heavy_closure(modules)
    hidden = []
    for name, path in modules.items():
        lines = path.read_text().split("\n")
        tree = ast.parse(path.read_text())
        skip = _type_checking_nodes(tree)
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in {id(n): n for f in functions for n in ast.walk(f)}.values():
            if id(node) in skip or not isinstance(node, ast.ImportFrom) or node.level != 0:
                continue
            if not (node.module or "").startswith("sparkml_dist"):
                continue
            brings = set().union(
                *(heavy[m] for t in _import_targets(node, modules) for m in _runs(t, modules) if m != name)
            )
            kept_out = brings - heavy[name]
            if not kept_out or not _reason_names_one_of(kept_out, lines, node):
                hidden.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {ast.unparse(node)}")
    assert hidden == []


def _reason_names_one_of(libraries: set[str], lines: list[str], node: ast.ImportFrom) -> bool:
    """The import's one-line reason (a comment on its lines, or on the line above its block of
    imports) names a library it keeps out ('Spark' counts for pyspark)."""
    comments = [line.split("#", 1)[1] for line in lines[node.lineno - 1 : node.end_lineno] if "#" in line]
    above = node.lineno - 2
    while above >= 0 and lines[above].strip().startswith(("from ", "import ", ")")):
        above -= 1
    if above >= 0 and lines[above].strip().startswith("#"):
        comments.append(lines[above])
    words = {lib: (lib, "spark") if lib == "pyspark" else (lib,) for lib in libraries}
    return any(w in c.lower() for c in comments for lib in libraries for w in words[lib])


def test_the_walker_sees_a_cycle_through_a_package_init():
    # federated.server -> stages.paths ran stages/__init__ -> stages.train -> federated.server
    graph = {"a.server": {"b", "b.paths"}, "b": {"b.train"}, "b.train": {"a.server"}, "b.paths": set()}
    assert _cycles(graph) == [["a.server", "b", "b.train"]]


def _method_names() -> set[str]:
    from sparkml_dist.methods import method_names

    return set(method_names())


def _model_kinds() -> set[str]:
    from sparkml_dist.models.kinds import MODEL_KINDS

    return set(MODEL_KINDS.names())


def _source_formats() -> set[str]:
    from sparkml_dist.data.formats import SOURCE_FORMATS

    return set(SOURCE_FORMATS.names())


def _backends() -> set[str]:
    from sparkml_dist.launch.backends import BACKENDS

    return set(BACKENDS.names())


def _tasks() -> set[str]:
    from sparkml_dist.tasks import TASKS

    return set(TASKS.names())


def _storage_schemes() -> set[str]:
    from sparkml_dist.storage.store import SCHEMES

    return set(SCHEMES.names())


_AXES = {
    "train.strategy": _method_names,
    "model.kind": _model_kinds,
    "data.format": _source_formats,
    "train.backend": _backends,
    "data.label.task": _tasks,
    "storage scheme": _storage_schemes,
}


@pytest.mark.parametrize("axis", list(_AXES))
def test_an_axis_entry_is_never_compared_by_name_outside_its_own_registration(axis):
    """Every axis of growth (`train.strategy`, `model.kind`, `data.format`, `train.backend`,
    `data.label.task`, a storage URI's scheme) is looked up in its registry (an entry carries its
    capabilities), never compared by name: adding a method, a model kind, a source format, a
    backend, a task or a scheme touches one place."""
    names = _AXES[axis]()
    assert len(names) >= 2, "the registry's built-ins loaded"
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            constants: list[ast.AST] = []
            if isinstance(node, ast.Compare):
                constants = [node.left, *node.comparators]
                constants += [
                    e
                    for c in node.comparators
                    if isinstance(c, (ast.Tuple, ast.List, ast.Set))
                    for e in c.elts
                ]
            elif isinstance(node, ast.Dict):
                constants = [k for k in node.keys if k is not None]
            hits = [c.value for c in constants if isinstance(c, ast.Constant) and c.value in names]
            if hits:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {ast.unparse(node)[:80]}")
    assert offenders == []


def test_importing_the_package_and_reading_a_config_stay_light():
    """`import sparkml_dist` and choosing a method while validating a config import neither torch nor pyspark."""
    code = (
        "import sys, sparkml_dist; from sparkml_dist.config import load_config; "
        "load_config('conf/adult.yaml', ['train.strategy=pipeline', 'model.kind=transformer']); "
        "print(sorted(m for m in ('torch', 'pyspark', 'mlflow') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent
    ).stdout
    assert out.strip() == "[]"


def test_the_public_surface_resolves_and_is_documented():
    import sparkml_dist

    for name in sparkml_dist.__all__:
        assert getattr(sparkml_dist, name) is not None, name
    with pytest.raises(AttributeError):
        sparkml_dist.not_a_name  # noqa: B018
    architecture = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    missing = [n for n in sparkml_dist.__all__ if f"`{n}`" not in architecture]
    assert missing == [], "docs/architecture.md lists every public name"


@pytest.mark.parametrize(
    "error",
    [
        "ConfigError('train.epochs: must be >= 1')",
        "DataError('x.csv: no rows')",
        "SlotError(2, 4)",
        "TrainingFailed(3, 'rank 1 failed', retryable=False)",
        "RankFailure([RankReport(1, 'h', 'DataError', 'bad file', retryable=False)], 'stage failed')",
    ],
)
def test_errors_pickle_and_say_whether_a_retry_can_help(error):
    from sparkml_dist import errors

    value = eval(error, vars(errors))
    again = pickle.loads(pickle.dumps(value))
    assert type(again) is type(value) and str(again) == str(value)
    assert again.retryable == value.retryable
    expected = {
        "ConfigError": False,
        "DataError": False,
        "SlotError": True,
        "TrainingFailed": False,
        "RankFailure": False,
    }[type(value).__name__]
    assert value.retryable is expected


def test_a_rank_failure_is_retryable_only_if_every_rank_says_so():
    from sparkml_dist.errors import RankFailure, RankReport

    lost = RankReport(0, "h", "PeerLost", "rank 1 stopped")
    crashed = RankReport(1, "h", "RuntimeError", "the rank's child process died")
    bad_data = RankReport(1, "h", "DataError", "unreadable", retryable=False)
    assert RankFailure([lost, crashed]).retryable
    assert not RankFailure([lost, bad_data]).retryable
