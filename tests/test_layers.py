"""The import rule of ptxbuild's layered layout (issue 26; ../shared notes: architecture.md).

    L4  cli/                                   the only click importer
    L3  build/  cluster/                       cluster: several GPUs (local workers, Ray actors);
                                               build reaches them only through the Context
    L2  store/  compile/  search/  gpu/  outputs/   siblings do not import each other, except
                                               search -> store and outputs -> store
    L1  declare/  oploader  contract
    L0  problem  dtypes  outcome  errors  records  launch  keys  coverage
    leg runtime(/) + torch_ops + integrations -> L0, L1 and outputs/manifest only;
        only ptxbuild/__init__ (ptxbuild.load, patch_rmsnorm) imports it

Imports point down only. Modules of one L0 or L1 layer, of one L2 package, of build/, of cli/ or of
the runtime leg may import each other. Every import counts, the ones inside functions too: a late
import is fine where the same import at the top would be (the CLI's, for start-up time), and a late
import that only dodges a cycle shows up here as that cycle. Imports of third-party packages (cupy,
torch, numba, ...) are not ptxbuild's and are not looked at.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "ptxbuild"

L0 = {"problem", "dtypes", "outcome", "errors", "records", "launch", "keys", "coverage"}
L1 = {"declare", "oploader", "contract"}
L2 = {"store", "compile", "search", "gpu", "outputs"}
L2_ALLOWED = {("search", "store"), ("outputs", "store")}
LEG = {"runtime", "torch_ops", "integrations"}
LEG_MAY_IMPORT = {"ptxbuild.outputs.manifest"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> list[tuple[str, int, bool]]:
    """(imported ptxbuild module, line, inside a function?) for every import in the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    late: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            late.update(id(n) for n in ast.walk(fn) if n is not fn)
    out = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import sub` imports the submodule pkg.sub where there is one
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in modules]
            targets = subs or [mod]
        for t in targets:
            if t == "ptxbuild" or t.startswith("ptxbuild."):
                while t not in modules and "." in t:  # `import a.b.c` of a name, not a module
                    t = t.rpartition(".")[0]
                out.append((t, node.lineno, id(node) in late))
    return out


def unit(module: str) -> tuple[int, str] | None:
    """(layer, unit) of a module: modules of one unit may import each other; None: unassigned."""
    parts = module.split(".")
    if module == "ptxbuild":
        return (5, "facade")
    top = parts[1]
    if top in LEG:
        return (-1, "leg")
    if top in L0 and len(parts) == 2:
        return (0, "L0")
    if top in L1:
        return (1, "L1")
    if top in L2:
        return (2, top)
    if top == "build":
        return (3, "build")
    if top == "cluster":
        return (3, "cluster")
    if top == "cli":
        return (4, "cli")
    return None


def allowed(src: str, dst: str) -> bool:
    (ls, us), (ld, ud) = unit(src), unit(dst)
    if us == ud:
        return True
    if us == "facade":
        return ud == "leg"
    if ud == "leg":
        return False  # nothing depends on the runtime leg but the facade
    if us == "leg":
        return ld in (0, 1) or dst in LEG_MAY_IMPORT
    if ls == ld == 2:
        return (us, ud) in L2_ALLOWED
    return ld < ls


def graph() -> dict[str, list[tuple[str, int, bool]]]:
    files = {module_name(p): p for p in PKG.rglob("*.py") if p.name != "__main__.py"}
    files.update({module_name(p) + ".__main__": p for p in PKG.rglob("__main__.py")})
    modules = set(files)
    return {m: imports(p, modules) for m, p in files.items()}


def violations(edges: dict[str, list[tuple[str, int, bool]]]) -> list[str]:
    bad = []
    for src, deps in sorted(edges.items()):
        if unit(src) is None:
            bad.append(f"{src}: not in any layer; add it to tests/test_layers.py's map")
            continue
        for dst, line, late in deps:
            if unit(dst) is None:
                continue  # reported as its own source
            if not allowed(src, dst):
                (ls, us), (ld, ud) = unit(src), unit(dst)
                how = "a late import" if late else "an import"
                bad.append(f"{src}:{line}: {how} of {dst} ({ud}, L{ld}) from {us} (L{ls})")
    return bad


def cycles(edges: dict[str, list[tuple[str, int, bool]]]) -> list[list[str]]:
    """Every import cycle, each once, as the list of modules around it."""
    found, state = [], {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = "open"
        stack.append(m)
        for dst, _, _ in edges.get(m, ()):
            if dst == m:
                continue
            if state.get(dst) == "open":
                cyc = stack[stack.index(dst) :]
                if sorted(cyc) not in [sorted(c) for c in found]:
                    found.append(cyc)
            elif dst not in state:
                visit(dst, stack)
        stack.pop()
        state[m] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m, [])
    return found


def test_every_import_points_down_a_layer():
    bad = violations(graph())
    assert not bad, "imports against the layer rule:\n" + "\n".join(bad)


def test_there_is_no_import_cycle_late_imports_included():
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c + c[:1]) for c in found)


def test_only_the_cli_imports_click():
    users = {
        m for m, p in {module_name(p): p for p in PKG.rglob("*.py")}.items() if "click" in _tops(p)
    }
    assert users and all(m.startswith("ptxbuild.cli") for m in users), users


def _tops(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom) and not n.level and n.module:
            out.add(n.module.split(".")[0])
    return out


def test_the_rule_catches_an_upward_a_sideways_and_a_leg_import():
    edges = {
        "ptxbuild.outputs.lockfile": [("ptxbuild.build.target", 3, True)],
        "ptxbuild.store.lessons_io": [("ptxbuild.compile.compiler", 5, False)],
        "ptxbuild.outputs.report": [("ptxbuild.store.cache", 7, False)],
        "ptxbuild.runtime": [("ptxbuild.store.cache", 9, False), ("ptxbuild.launch", 10, False)],
        "ptxbuild.torch_ops": [("ptxbuild.outputs.manifest", 11, False)],
        "ptxbuild.build.target": [("ptxbuild.runtime", 12, False)],
        "ptxbuild.newthing": [],
    }
    assert violations(edges) == [
        "ptxbuild.build.target:12: an import of ptxbuild.runtime (leg, L-1) from build (L3)",
        "ptxbuild.newthing: not in any layer; add it to tests/test_layers.py's map",
        "ptxbuild.outputs.lockfile:3: a late import of ptxbuild.build.target (build, L3) "
        "from outputs (L2)",
        "ptxbuild.runtime:9: an import of ptxbuild.store.cache (store, L2) from leg (L-1)",
        "ptxbuild.store.lessons_io:5: an import of ptxbuild.compile.compiler (compile, L2) "
        "from store (L2)",
    ]


def test_a_late_import_that_closes_a_cycle_is_found():
    edges = {
        "ptxbuild.build.target": [("ptxbuild.build.locked", 1, True)],
        "ptxbuild.build.locked": [("ptxbuild.build.target", 2, False)],
        "ptxbuild.keys": [("ptxbuild.problem", 3, False)],
        "ptxbuild.problem": [],
    }
    assert cycles(edges) == [["ptxbuild.build.locked", "ptxbuild.build.target"]]


def test_relative_imports_resolve_to_modules(tmp_path):
    """`from .. import keys` is an import of the module ptxbuild.keys, not of the package."""
    edges = graph()
    target = {d for d, _, _ in edges["ptxbuild.build.target"]}
    assert {"ptxbuild.keys", "ptxbuild.outputs.gates", "ptxbuild.store.learn"} <= target
    assert "ptxbuild" not in target
