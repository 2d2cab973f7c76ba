"""The package's import graph: no cycle between modules or between sub-packages, no module importing from a higher
layer, and nothing importing the repository's packages outside the runtime one (training/). Every import counts, those
inside functions too."""

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lightllm_mtp"
# lower layers never import higher ones
LAYERS = {
    "env": 0, "config": 0, "sampling_params": 0, "chat_templates": 0,
    "kernels": 1, "sampling": 1,
    "common": 2, "multimodal": 2,
    "models": 3,
    "spec_decode": 4,
    "engine": 5,
    "server": 6, "tools": 6, "__main__": 6,
}  # fmt: skip
# packages of the repository beside lightllm_mtp that the runtime package never imports (they import it)
OUTSIDE_THE_RUNTIME = ("training",)


def module_imports() -> dict[str, set[str]]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges = defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + [base] * bool(base))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                found = resolve(target) if target.startswith("lightllm_mtp") else None
                inside = found is not None and name.startswith(found + ".")
                own_package = inside and modules[found].name == "__init__.py"
                if found and found != name and not own_package:
                    edges[name].add(found)
    return edges


def imports_outside_the_runtime(source: str) -> list[str]:
    """The modules of OUTSIDE_THE_RUNTIME that `source` imports (absolute imports; relative ones stay in the package)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [n for n in names if n.split(".")[0] in OUTSIDE_THE_RUNTIME]
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
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

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_import_cycle_between_modules():
    assert cycles(module_imports()) == []


def test_no_import_cycle_between_sub_packages():
    packages = defaultdict(set)
    for a, bs in module_imports().items():
        packages[top(a)] |= {top(b) for b in bs if top(b) != top(a)}
    assert cycles(packages) == []


def test_no_module_imports_a_higher_layer():
    upward = [
        (a, b) for a, bs in module_imports().items() for b in bs
        if top(a) in LAYERS and top(b) in LAYERS and LAYERS[top(b)] > LAYERS[top(a)]
    ]  # fmt: skip
    assert upward == []


def test_every_sub_package_has_a_layer():
    assert {top(m) for m in module_imports()} - {"__init__"} <= set(LAYERS)


def test_the_checks_catch_a_cycle_and_an_upward_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert LAYERS["kernels"] < LAYERS["engine"]


def test_the_runtime_package_never_imports_training():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        hits = imports_outside_the_runtime(path.read_text())
        if hits:
            found[str(path.relative_to(PACKAGE.parent))] = hits
    assert found == {}


def test_the_training_check_catches_an_import():
    source = "import training.train_tiny\nfrom training import trainable_mtp\nfrom lightllm_mtp.tools import tiny_recipe\n"
    source += "def f():\n    from training.eval_heldout import main\n"
    assert imports_outside_the_runtime(source) == ["training.train_tiny", "training", "training.eval_heldout"]
    assert imports_outside_the_runtime("from . import training\nimport trainingwheels\n") == []
