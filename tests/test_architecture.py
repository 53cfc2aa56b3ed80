"""The import directions of ARCHITECTURE.md hold: every import between tuner's parts, at
module level or inside a function (those under ``if TYPE_CHECKING:`` aside), goes down
the layers, parts declared independent never import each other, and no module imports
itself back through others; and no module reaches into Optuna's private attributes."""
from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "tuner"

#: The layers, lowest first; a part (a top-level module or package of tuner) may import
#: parts of its own layer and of the layers below, never above (ARCHITECTURE.md).
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("core", frozenset({"core", "runtime"})),
    ("nouns", frozenset({"serving", "traffic"})),
    ("engines", frozenset({"sim", "replay"})),
    ("backends", frozenset({"backends", "space", "testing"})),
    ("studies", frozenset({"study"})),
    ("search", frozenset({"search"})),
    ("tools", frozenset({"plan", "plots", "calibrate", "report", "ops", "fleet"})),
    ("api", frozenset({"__init__"})),
    ("cli", frozenset({"cli", "__main__"})),
)
#: Parts of one layer that must not import each other (reading a study never loads the
#: search: ``study`` sits a layer below ``search``).
INDEPENDENT = ({"sim", "replay"}, {"backends", "space"})


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _part(module: str) -> str:
    names = module.split(".")
    return names[1] if len(names) > 1 else "__init__"


def _type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """``(module imported, line, inside a function)`` for each tuner import of the file."""
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for sub in child.orelse:
                    visit(sub, in_function)
                continue
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, nested) for a in child.names if a.name.startswith("tuner"))
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and (child.module or "").startswith("tuner"):
                out.extend((f"{child.module}.{a.name}", child.lineno, nested) for a in child.names)
            visit(child, nested)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return out


def import_graph() -> dict[str, set[tuple[str, int, bool]]]:
    """Module -> the tuner modules it imports (a name imported from a package resolves to
    the submodule when there is one, else to the package)."""
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[tuple[str, int, bool]]] = {}
    for module, path in files.items():
        edges = set()
        for target, line, nested in imports(path):
            while target not in files and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in files and target != module:
                edges.add((target, line, nested))
        graph[module] = edges
    return graph


LAYER_OF = {part: i for i, (_, parts) in enumerate(LAYERS) for part in parts}


def test_every_part_of_tuner_has_a_layer():
    parts = {_part(_module(p)) for p in PACKAGE.rglob("*.py")}
    assert parts - set(LAYER_OF) == set(), "add the new part to LAYERS here and to ARCHITECTURE.md"


def test_no_module_lies_loose_at_the_root_of_tuner():
    """Every module is in the package of its part; the root keeps the API and ``python -m tuner``."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py"], "put the module in its part's package (ARCHITECTURE.md)"


def test_no_package_names_a_submodule_after_a_name_it_hands_on():
    """Importing ``pkg.x`` binds the module to ``pkg.x``: where the package's ``__init__`` binds
    ``x`` to something else (a function from another submodule), the first import of the
    submodule hides it. A package that imports the submodule first, then binds the name
    (``tuner`` loads ``tuner.search`` and then defines the verb ``search``), is not hidden:
    a submodule is bound to its parent once, when it is first imported."""
    wrong = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        package = _module(init)
        submodules = ({p.stem for p in init.parent.glob("*.py")}
                      | {p.parent.name for p in init.parent.glob("*/__init__.py")})
        loaded: set[str] = set()
        for node in ast.parse(init.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Expr) and ast.unparse(node).startswith("importlib.import_module("):
                loaded.add(str(ast.literal_eval(node.value.args[0])).removeprefix(f"{package}."))  # type: ignore[attr-defined]
                continue
            if isinstance(node, ast.ImportFrom):
                bound = [(a.asname or a.name, node.module == f"{package}.{a.asname or a.name}"
                          or f"{node.module}.{a.name}" == f"{package}.{a.asname or a.name}") for a in node.names]
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                bound = [(node.name, False)]
            elif isinstance(node, ast.Assign):
                bound = [(t.id, False) for t in node.targets if isinstance(t, ast.Name)]
            else:
                continue
            wrong += [f"{init.relative_to(PACKAGE.parent)}:{node.lineno}: {name} is also {package}.{name}"
                      for name, own in bound if name in submodules and not own and name not in loaded]
    assert not wrong, "\n".join(wrong)


def test_imports_go_down_the_layers_never_up_nor_across_independent_parts():
    wrong = []
    files = {_module(p): p.relative_to(PACKAGE.parent) for p in PACKAGE.rglob("*.py")}
    for module, edges in import_graph().items():
        for target, line, nested in edges:
            a, b = _part(module), _part(target)
            if a == b:
                continue
            where = f"{files[module]}:{line}{' (in a function)' if nested else ''}"
            if LAYER_OF[b] > LAYER_OF[a]:
                wrong.append(f"{where}: {a} ({LAYERS[LAYER_OF[a]][0]}) imports {target} ({LAYERS[LAYER_OF[b]][0]})")
            elif any({a, b} <= pair for pair in INDEPENDENT):
                wrong.append(f"{where}: {a} imports {target}; they are independent")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_module_imports_itself_back_through_others():
    graph = {m: {t for t, _, _ in edges} for m, edges in import_graph().items()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        pytest.fail(f"import cycle: {' -> '.join(err.args[1])}")


def test_the_check_sees_imports_inside_functions_and_skips_type_only_ones(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nimport tuner.core.errors\nif TYPE_CHECKING:\n"
                   "    from tuner.plan import x\ndef f():\n    from tuner.cli import app\n")
    assert imports(src) == [("tuner.core.errors", 2, False), ("tuner.cli.app", 6, True)]


#: Most lines a module of tuner may have (issue 33: split by noun past that).
MAX_LINES = 400
#: Modules still over :data:`MAX_LINES`, each to be split; a module leaves the list when it is.
OVER_MAX_LINES: frozenset[str] = frozenset()  # none: a module over 400 lines is split by noun


def test_no_module_is_over_400_lines_but_those_being_split():
    lines = {p.relative_to(PACKAGE.parent).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
             for p in PACKAGE.rglob("*.py")}
    over = {m: n for m, n in lines.items() if n > MAX_LINES and m not in OVER_MAX_LINES}
    assert not over, f"split by noun (ARCHITECTURE.md): {over}"
    stale = sorted(m for m in OVER_MAX_LINES if lines.get(m, 0) <= MAX_LINES)
    assert not stale, f"take these off OVER_MAX_LINES, they are split: {stale}"


#: Private attributes of Optuna's objects (``Study``, ``Trial``, ``FrozenTrial``, storages)
#: that tuner once used, none left; their public counterparts: tuner's own storage handle
#: (:func:`tuner.study.storage.storage_of`, or the one the caller passes) and its public methods,
#: ``study.get_trials``, ``trial.number``, ``GridSampler.is_exhausted``.
OPTUNA_PRIVATE = re.compile(r"\.(_storage|_trial_id|_study_id|_get_trials|_stop_flag)\b")


def test_no_module_uses_private_attributes_of_optuna_objects():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE.parent))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for found in OPTUNA_PRIVATE.finditer(line):
                wrong.append(f"{name}:{n}: .{found.group(1)} ({line.strip()})")
    assert not wrong, "Optuna's private API:\n" + "\n".join(wrong)


def test_only_tests_use_tuner_testing_and_only_it_imports_pytest():
    """pytest is no dependency of tuner: ``tuner.testing`` (the contract a backend's tests
    subclass) imports it, and no other module of tuner imports either."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE.parent).as_posix()
        if name.startswith("tuner/testing/"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            wrong += [f"{name}:{node.lineno}: {n}" for n in names if n.split(".")[0] == "pytest"
                      or n.startswith("tuner.testing")]
    assert not wrong, "\n".join(wrong)


#: Imports of tuner's own modules inside functions, tuner/cli included: the API's verbs (``import tuner``
#: stays cheap), the backend factory's choice, ``tuner sim-serve``'s implementation (the command started once
#: per trial), the CLI's study-database error path, and a few whose name a module or function also binds.
#: A new one goes to the top of its module (--help with every command module hoisted: benchmarks/cli_startup.py).
MAX_FUNCTION_LEVEL_IMPORTS = 22


def test_tuners_own_imports_are_at_the_top_of_their_modules_but_a_counted_few():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE.parent).as_posix()
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [f"{name}:{n.lineno}" for n in ast.walk(fn)
                          if isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").startswith("tuner")
                          or isinstance(n, ast.Import) and any(a.name.startswith("tuner") for a in n.names)]
    assert len(found) <= MAX_FUNCTION_LEVEL_IMPORTS, "move these to the top of their module:\n" + "\n".join(found)
