"""The package's import graph: no circles, and layers import only downward.

Every ``import`` in every module counts, also those inside functions and under
``TYPE_CHECKING``: a cycle that only type checkers see is still a cycle in the design.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hipr

ROOT = Path(hipr.__file__).parent

#: Which layer may import which (a layer always imports itself). Lower layers never
#: name higher ones; see docs/architecture.md.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "_version": set(),
    # When a pooled buffer is free again (its reference count): payload buffers of the
    # worker and page-locked ones of a GPU backend.
    "refcount": set(),
    # How many CPUs this process may use, and the automatic spin of client and worker.
    "cpus": set(),
    "protocol": {"errors"},
    "kernels": {"errors"},
    "transports": {"errors"},
    "backends": {"errors", "kernels", "refcount"},
    "observability": {"errors", "_version", "protocol", "backends"},
    "client": {"errors", "_version", "cpus", "protocol", "transports", "kernels", "backends"},
    # hip-python's names over the client (issue 14); hipr/hip.py and hipr/hiprtc.py are
    # its two public modules.
    "facade": {"errors", "_version", "protocol", "kernels", "backends", "client"},
    "hip": {"facade"},
    "hiprtc": {"facade"},
    # The native proxy's build and generated tables (the tables read hipr.facade's names).
    "proxy": {"facade"},
    # A client's session on the worker as handlers act on it: its handle and allocation
    # tables, quotas, GPU thread and reply cache.
    "sessions": {"errors", "backends", "observability"},
    "handlers": {
        "errors",
        "_version",
        "protocol",
        "kernels",
        "backends",
        "observability",
        "sessions",
    },
    "worker": {
        "errors",
        "_version",
        "cpus",
        "refcount",
        "protocol",
        "transports",
        "kernels",
        "backends",
        "observability",
        "sessions",
        "handlers",
    },
    # The benchmark suite ``hipr bench`` runs (baselines, floors, the runner): it drives
    # a worker and clients as testing does; only the CLI imports it.
    "bench": {
        "errors",
        "_version",
        "protocol",
        "transports",
        "kernels",
        "backends",
        "worker",
        "client",
        "hip",
        "hipr",
    },
    "testing": {
        "errors",
        "_version",
        "protocol",
        "transports",
        "kernels",
        "backends",
        "observability",
        "worker",
        "client",
        "hipr",
    },
    "cli": {
        "errors",
        "_version",
        "protocol",
        "transports",
        "kernels",
        "backends",
        "observability",
        "worker",
        "client",
        "sessions",
        "handlers",
        "facade",
        "proxy",
        "bench",
        "hipr",
    },
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    origin = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    origin = node.module or ""
                targets = [
                    f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin
                    for a in node.names
                ]
            else:
                continue
            deps.update(t for t in targets if t in modules and t != name)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

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


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "hipr"


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert cycles(import_graph()) == []


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_layers_import_only_downward() -> None:
    wrong = []
    for module, deps in import_graph().items():
        own = layer(module)
        if own not in ALLOWED:
            continue  # the package root and top-level modules (hipr/__init__, __main__)
        for dep in deps:
            other = layer(dep)
            if other != own and other not in ALLOWED[own]:
                wrong.append(f"{module} -> {dep}")
    assert wrong == []


@pytest.mark.parametrize("layer_name", sorted(ALLOWED))
def test_every_layer_is_a_real_part_of_the_package(layer_name: str) -> None:
    assert (ROOT / layer_name).is_dir() or (ROOT / f"{layer_name}.py").is_file()


def test_few_modules_lie_directly_in_the_package() -> None:
    loose = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(loose) <= 8, loose


def duplicated_base_names(root: Path = ROOT) -> dict[str, set[str]]:
    """Module file names (``__init__`` and ``__main__`` aside) used in more than one place."""
    seen: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        if path.stem in ("__init__", "__main__"):
            continue
        seen.setdefault(path.stem, set()).add(path.relative_to(root.parent).as_posix())
    return {name: paths for name, paths in seen.items() if len(paths) > 1}


def test_duplicate_finder_finds_a_duplicate(tmp_path: Path) -> None:
    for name in ("pkg/a/args.py", "pkg/b/args.py", "pkg/a/__init__.py", "pkg/b/__init__.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert duplicated_base_names(tmp_path / "pkg") == {"args": {"pkg/a/args.py", "pkg/b/args.py"}}


def test_no_two_modules_share_a_base_name() -> None:
    """``from hipr.x import args`` and ``from hipr.y import args`` read alike in a diff and
    in a traceback: each module's name says what it holds, once in the package."""
    assert duplicated_base_names() == {}


#: Lines past which a hand-written module should be split (a generated table says
#: "GENERATED" in its docstring and is exempt).
MAX_MODULE_LINES = 800


def test_no_hand_written_module_is_too_long() -> None:
    long = set()
    for path in [*ROOT.rglob("*.py"), *(ROOT.parent / "benchmarks").rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        if "GENERATED" in text[:400]:
            continue
        if text.count("\n") > MAX_MODULE_LINES:
            long.add(path.relative_to(ROOT.parent).as_posix())
    assert long == set()


def test_every_package_is_named_in_the_architecture_doc() -> None:
    doc = (ROOT.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    packages = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))
    assert len(packages) > 10
    assert [name for name in packages if f"hipr/{name}/" not in doc] == []
