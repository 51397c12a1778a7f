"""privzo's imports point down its layers: no cycles, no borrowed private names.

Every ``import`` and ``from ... import`` in every module under platform/privzo is read with
``ast``: module-level, function-level (lazy) and type-only (``if TYPE_CHECKING:``) ones alike,
since each is a dependency of the importing module on the imported one whenever it runs.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "platform" / "privzo"

# Layer of each package or module (the longest matching name wins); an import may point to the
# same layer or a lower one, never up. The order is the architecture's
# (shared/design/architecture.md): entry points → searches, studies → the run pipeline →
# layouts and algorithms → the parts (zo, privacy, models, tasks, tracking) → the config
# sections and what they read.
LAYERS = {
    # 0: leaves that import no other privzo layer
    "privzo": 0,  # the package itself (``__version__``)
    # the run config: the base of every section, each package's section (beside the code it
    # configures, beneath every layer that reads a config), and RunConfig and its loader
    # composing them; ``privzo.config.tasks`` stays in the config package because importing
    # ``privzo.tasks`` loads torch, and a config must load before torch does
    "privzo.section": 0,
    "privzo.models.config": 0,
    "privzo.algorithms.config": 0,
    "privzo.privacy.config": 0,
    "privzo.layouts.config": 0,
    "privzo.tracking.config": 0,
    "privzo.config": 0,
    "privzo.extras": 0,
    "privzo.threads": 0,
    "privzo.memory": 0,
    "privzo.demo_data": 0,
    "privzo.dirlock": 0,  # the run directory's lock
    "privzo.results": 0,  # key access to a typed result's record
    # what the config reads at load: the noise each algorithm adds, and the accountants (with the
    # validators and grids they need), whose classes state which noise each one bounds
    "privzo.algorithms.noise": 0,
    "privzo.privacy.accountants": 0,  # its own order: ACCOUNTANT_LAYERS
    "privzo.privacy.checks": 0,
    "privzo.privacy.discrete": 0,
    # 1: the parts
    "privzo.zo": 1,
    "privzo.privacy": 1,
    "privzo.models": 1,
    "privzo.tasks": 1,
    "privzo.tracking": 1,
    "privzo.planner": 1,
    "privzo.forward_memory": 1,  # the memory of one forward, which the planner places
    # 2: layouts and algorithms, with the machinery the multi-process layouts run on
    "privzo.layouts": 2,
    "privzo.algorithms": 2,
    "privzo.distributed": 2,
    "privzo.baselines": 2,
    "privzo.synthetic": 2,  # the algorithms on synthetic quadratics
    "privzo.rundir": 2,  # a run's directory: written by every layout, read by every caller
    # 3: the run pipeline, and what reads a run's records
    "privzo.run": 3,
    "privzo.preflight": 3,  # every check before weights load; run() calls it first
    "privzo.replay": 3,
    "privzo.analysis": 3,
    # 4: searches and studies, made of runs
    "privzo.search": 4,
    "privzo.studies": 4,
    "privzo.audit": 4,  # a run with canaries, scored and bounded (privzo.privacy.audit)
    # 5: entry points
    "privzo.cli": 5,  # its own order: CLI_LAYERS
    "privzo.__main__": 5,  # python -m privzo: the CLI
    "privzo.demo": 5,
    "privzo.bench": 5,  # zo-step, memory, distributed and the kernels' check
}

# Inside privzo.privacy.accountants, from the bottom: the memo of ε evaluations, the query
# (what ε and calibration are asked about), the shared settings and their checks, and the
# refusal of noise an accountant cannot bound; the one calibration search (which knows no
# accountant: they hand it ε(σ) curves), the run's dp_accounting event and the base class every
# accountant shares, the accountants, and the registry, the only module that knows them all.
ACCOUNTANT_LAYERS = {
    "privzo.privacy.accountants.memo": 0,
    "privzo.privacy.accountants.query": 0,
    "privzo.privacy.accountants.settings": 0,
    "privzo.privacy.accountants.refusal": 0,
    "privzo.privacy.accountants.calibration": 1,
    "privzo.privacy.accountants.events": 2,
    "privzo.privacy.accountants.base": 2,
    "privzo.privacy.accountants.pure": 3,
    "privzo.privacy.accountants.pld": 3,
    "privzo.privacy.accountants.rdp": 3,
    "privzo.privacy.accountants.numeric": 3,
    "privzo.privacy.accountants.registry": 4,
    "privzo.privacy.accountants": 5,  # re-exports only
}

# Inside privzo.cli, from the bottom: the shared argument helpers and the process policy, the
# command families (each adds its commands and handles them; none imports another), the entry
# point that assembles them, and the package's re-exports.
CLI_LAYERS = {
    "privzo.cli.arguments": 0,
    "privzo.cli.process": 0,
    "privzo.cli.audit": 1,
    "privzo.cli.bench": 1,
    "privzo.cli.demo": 1,
    "privzo.cli.models": 1,
    "privzo.cli.privacy": 1,
    "privzo.cli.run": 1,
    "privzo.cli.study": 1,
    "privzo.cli.tune": 1,
    "privzo.cli.entry": 2,
    "privzo.cli": 3,  # re-exports only
    "privzo.cli.__main__": 3,  # python -m privzo.cli
}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported privzo module
    name: str | None  # the name taken from it (``from target import name``), if any
    line: int

    def __str__(self) -> str:
        taken = f" ({self.name})" if self.name else ""
        return f"{self.source}:{self.line} -> {self.target}{taken}"


def module_files() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """The privzo modules ``name`` imports, resolved to modules (a name taken from a package
    that is itself a submodule counts as importing that submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [
                Import(name, alias.name, None, node.lineno)
                for alias in node.names
                if alias.name in modules
            ]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    found.append(Import(name, f"{base}.{alias.name}", None, node.lineno))
                elif base in modules:
                    found.append(Import(name, base, alias.name, node.lineno))
    return found


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def all_imports() -> list[Import]:
    modules = module_files()
    return [found for name, path in modules.items() for found in imports_of(name, path, modules)]


def layer(module: str) -> int:
    """The layer of the longest name in ``LAYERS`` that is ``module`` or a package holding it;
    the root package's entry covers only the root itself, so a new module must be placed."""
    parts = module.split(".")
    for end in range(len(parts), 1, -1):
        prefix = ".".join(parts[:end])
        if prefix in LAYERS:
            return LAYERS[prefix]
    if module == "privzo":
        return LAYERS["privzo"]
    raise AssertionError(f"{module} has no layer: add it (or its package) to LAYERS")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module importing itself
    (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(edges[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges[node]:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_module_has_a_layer():
    for module in module_files():
        layer(module)


def test_no_import_cycles():
    edges: dict[str, set[str]] = {name: set() for name in module_files()}
    for found in all_imports():
        edges[found.source].add(found.target)
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(map(str, found))


def test_no_private_name_is_imported_from_another_module():
    borrowed = [
        str(found)
        for found in all_imports()
        if found.name is not None
        and found.name.startswith("_")
        and not (found.name.startswith("__") and found.name.endswith("__"))
        and found.target != found.source
    ]
    assert not borrowed, "private names imported:\n" + "\n".join(borrowed)


def test_imports_point_down_the_layers():
    upward = [
        f"{found} (layer {layer(found.source)} -> {layer(found.target)})"
        for found in all_imports()
        if layer(found.target) > layer(found.source)
    ]
    assert not upward, "imports pointing up:\n" + "\n".join(upward)


def test_accountants_point_down_their_package():
    package = "privzo.privacy.accountants"
    inside = [
        found
        for found in all_imports()
        if found.source.startswith(package) and found.target.startswith(package)
    ]
    assert inside, "no imports inside privzo.privacy.accountants were found"
    placed = set(ACCOUNTANT_LAYERS)
    assert {name for name in module_files() if name.startswith(package)} == placed
    upward = [
        str(found)
        for found in inside
        if ACCOUNTANT_LAYERS[found.target] >= ACCOUNTANT_LAYERS[found.source]
        and found.target != found.source
    ]
    assert not upward, "accountant modules importing sideways or up:\n" + "\n".join(upward)


def test_cli_modules_point_down_their_package():
    """Command families share only the helpers below them, never each other's code."""
    package = "privzo.cli"
    inside = [
        found
        for found in all_imports()
        if found.source.startswith(package) and found.target.startswith(package)
    ]
    assert inside, "no imports inside privzo.cli were found"
    placed = set(CLI_LAYERS)
    assert {name for name in module_files() if name.startswith(package)} == placed
    sideways = [
        str(found)
        for found in inside
        if CLI_LAYERS[found.target] >= CLI_LAYERS[found.source] and found.target != found.source
    ]
    assert not sideways, "cli modules importing sideways or up:\n" + "\n".join(sideways)


def test_only_tracking_talks_to_mlflow():
    """MLflow (its client included) is reached through ``privzo.tracking`` alone."""
    outside = []
    for name, path in module_files().items():
        if name.startswith("privzo.tracking"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            imported = []
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if any(i == "mlflow" or i.startswith("mlflow.") for i in imported) or any(
                i.endswith(".open_client") for i in imported
            ):
                outside.append(f"{name}:{node.lineno}")
    assert not outside, "MLflow reached outside privzo.tracking: " + ", ".join(outside)


def test_the_checks_see_lazy_and_type_only_imports(tmp_path):
    """The walker finds imports inside functions and under ``if TYPE_CHECKING:`` too."""
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from privzo.run import RunContext\n"
        "def f():\n"
        "    from privzo.zo.step import _hidden\n"
    )
    modules = {"privzo.run": Path(), "privzo.zo.step": Path()}
    found = imports_of("privzo.probe", source, modules)
    assert sorted((i.line, i.target, i.name) for i in found) == [
        (3, "privzo.run", "RunContext"),
        (5, "privzo.zo.step", "_hidden"),
    ]


def test_a_cycle_is_found():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
