"""The rooms of preflight/ keep their rules, read from the source with ``ast``.

Every import counts: module level, inside a function, under ``if
TYPE_CHECKING:`` (a reader follows those too), relative ones, and
``importlib.import_module("...")`` with a literal name. ``from X import name``
imports the submodule ``X.name`` when there is one, else X. checks/ is
installed as ``preflight.checks`` (pyproject's package-dir), so its modules are
named that way here; the worker scripts in checks/workers/ run by path and
import their siblings by bare name (``import _rank``).

No import cycle may exist, and each room imports only what RULES allows it:
the one table of which room may import which.
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ROOMS = ("base", "readers", "gpuwork", "pipeline", "checkkit", "outputs", "cli")
# What preflight/ itself may hold: the package's face, `python -m preflight`, and the rooms.
TOP_LEVEL = {"__init__.py", "__main__.py", *ROOMS}

_BELOW_CHECKS = {"face", "base", "readers", "gpuwork", "pipeline", "checkkit"}
# room -> the rooms its modules may import. "face" is preflight/__init__.py (the
# version), "main" is preflight/__main__.py, "checks" one check of checks/, and
# "workers" the scripts in checks/workers/, which may also import the standard
# library and torch, and nothing else (they run in the training environment's
# interpreter, where preflight need not be installed).
RULES: dict[str, set[str]] = {
    "face": set(),
    "base": {"base"},
    "readers": {"face", "base", "readers"},
    "gpuwork": {"face", "base", "readers", "gpuwork"},
    "pipeline": {"face", "base", "readers", "gpuwork", "pipeline"},
    "checkkit": _BELOW_CHECKS,
    "checks": _BELOW_CHECKS,  # never another check: one check may not depend on another's code
    "workers": {"workers"},
    "outputs": _BELOW_CHECKS | {"checks", "workers", "outputs"},
    "cli": _BELOW_CHECKS | {"checks", "workers", "outputs", "cli"},
    "main": {"cli"},
}
WORKER_THIRD_PARTY = {"torch"}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the module it imports
    file: str  # path relative to the tree's root
    line: int
    text: str  # the statement as written
    written: str  # the name the statement gives (a relative one made absolute; a worker's sibling bare)

    def where(self) -> str:
        return f"{self.file}:{self.line}: `{self.text}`"


def module_files(root: Path) -> dict[str, Path]:
    """Module name -> file, for preflight/ and checks/ (as preflight.checks)."""
    found = {}
    for top, prefix in ((root / "preflight", ("preflight",)), (root / "checks", ("preflight", "checks"))):
        for path in sorted(top.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(top).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(prefix + parts)] = path
    return found


def room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "preflight":
        return None
    if len(parts) == 1:
        return "face"
    if parts[1] == "__main__":
        return "main"
    if parts[1] == "checks":
        return "workers" if parts[2:3] == ["workers"] else "checks"
    return parts[1] if parts[1] in ROOMS else None


def _is_worker(module: str) -> bool:
    return module.startswith("preflight.checks.workers.")


def _absolute(module: str, is_package: bool, name: str | None, level: int) -> str:
    """The module an import statement names, a relative one counted from the importer's package."""
    if not level:
        assert name is not None
        return name
    package = module.split(".") if is_package else module.split(".")[:-1]
    return ".".join(package[: len(package) - (level - 1)] + ([name] if name else []))


def _module(importer: str, name: str, known: dict[str, Path]) -> str:
    """The module a name is: a worker's bare sibling (``_rank``) is preflight.checks.workers._rank."""
    if _is_worker(importer) and f"preflight.checks.workers.{name.split('.')[0]}" in known:
        return f"preflight.checks.workers.{name}"
    return name


def imports_of(module: str, path: Path, root: Path, known: dict[str, Path]) -> list[Import]:
    """Every import in one file, wherever it stands in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    rel = path.relative_to(root).as_posix()
    out = []

    def add(written: str, node: ast.AST) -> None:
        target = _module(module, written, known)
        if target != module:
            out.append(Import(module, target, rel, node.lineno, ast.unparse(node), written))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node.module, node.level)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if _module(module, sub, known) in known else base, node)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            add(node.args[0].value, node)
    return out


def import_graph(root: Path) -> dict[str, list[Import]]:
    """Module -> its imports (every one, the standard library's and third parties' too)."""
    known = module_files(root)
    return {m: imports_of(m, p, root, known) for m, p in known.items()}


@dataclass(frozen=True)
class Cycle:
    path: list[Import]  # one shortest cycle, import by import
    knot: list[str]  # every module that cycles with it (they all import one another, round about)

    def __str__(self) -> str:
        chain = " -> ".join([self.path[0].source] + [i.target for i in self.path])
        more = sorted(set(self.knot) - {i.source for i in self.path})
        return "\n".join([chain, *(f"    {i.where()}" for i in self.path)]
                         + ([f"    (in the same knot: {', '.join(more)})"] if more else []))


def cycles(graph: dict[str, list[Import]]) -> list[Cycle]:
    """One shortest cycle through each strongly connected set of modules that has one."""
    edges = {m: sorted({i.target for i in imps if i.target in graph}) for m, imps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm; the graph is small, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            groups.append(group)

    for v in sorted(edges):
        if v not in index:
            connect(v)
    found = []
    for group in groups:
        if len(group) < 2:
            continue  # a module importing itself is dropped in imports_of
        inside = set(group)
        start = min(group)
        came_from: dict[str, Import] = {}
        queue = deque([start])
        while queue and start not in came_from:
            v = queue.popleft()
            for imp in graph[v]:
                if imp.target in inside and imp.target not in came_from:
                    came_from[imp.target] = imp
                    queue.append(imp.target)
        path, v = [], start
        while True:
            imp = came_from[v]
            path.append(imp)
            v = imp.source
            if v == start:
                break
        found.append(Cycle(path[::-1], sorted(group)))
    return found


def rule_breaks(graph: dict[str, list[Import]]) -> list[str]:
    """Each import a room's rule forbids: the file, the import, the rule."""
    out = []
    for module, imps in sorted(graph.items()):
        room = room_of(module)
        if room is None:
            out.append(f"{module}: in no room; put it in one of {', '.join(ROOMS)}")
            continue
        allowed = RULES[room]
        for imp in imps:
            top = imp.target.split(".")[0]
            if room == "workers":
                written = imp.written.split(".")[0]
                if written == "preflight":  # a sibling too: by path, there is no package to import it from
                    out.append(f"{imp.where()} imports {imp.target} (room {room_of(imp.target)}): a worker script runs "
                               "by path where preflight may not be installed; it imports its siblings by bare name")
                elif top != "preflight" and top not in sys.stdlib_module_names and top not in WORKER_THIRD_PARTY:
                    out.append(f"{imp.where()} imports {imp.target}: a worker script imports only the standard "
                               f"library, {', '.join(sorted(WORKER_THIRD_PARTY))} and its sibling workers")
                continue
            if top != "preflight":
                continue  # third parties are not the rooms' business
            target_room = room_of(imp.target)
            if target_room not in allowed:
                said = ", ".join(sorted(allowed)) or "nothing of preflight"
                also = "; never another check" if room == target_room == "checks" else ""
                out.append(f"{imp.where()} imports {imp.target} (room {target_room or 'none'}): "
                           f"room {room} may import only {said}{also}")
    return out


def layout_breaks(root: Path) -> list[str]:
    """preflight/ holds its face, __main__ and the rooms, each a package; nothing else."""
    here = {p.name for p in (root / "preflight").iterdir() if p.name != "__pycache__"}
    out = [f"preflight/{name}: preflight/ holds only {', '.join(sorted(TOP_LEVEL))}; move it into a room"
           for name in sorted(here - TOP_LEVEL)]
    out += [f"preflight/{room}/__init__.py is missing: every room is a package"
            for room in ROOMS if room in here and not (root / "preflight" / room / "__init__.py").is_file()]
    return out


@lru_cache(maxsize=None)
def _real_graph() -> dict[str, list[Import]]:
    return import_graph(ROOT)


def test_the_graph_sees_the_whole_tree():
    graph = _real_graph()
    assert {"preflight", "preflight.__main__", "preflight.checks", "preflight.checks.shm",
            "preflight.checks.workers._rank", "preflight.pipeline.check"} <= set(graph)
    # A TYPE_CHECKING import and a worker's bare sibling import are both edges.
    assert "preflight.pipeline.settings" in {i.target for i in graph["preflight.pipeline.check"]}
    assert "preflight.checks.workers._rank" in {i.target for i in graph["preflight.checks.workers.nccl_smoke"]}


def test_no_import_cycle():
    found = cycles(_real_graph())
    assert not found, "import cycles:\n" + "\n".join(map(str, found))


def test_each_room_imports_only_what_its_rule_allows():
    found = rule_breaks(_real_graph())
    assert not found, "imports the rooms' rules forbid:\n" + "\n".join(found)


def sub_room_edges(root: Path) -> dict[str, set[tuple[str, str]]]:
    """Within each room, which of its sub-rooms (its packages; "" the modules at its top)
    imports which other."""
    known = module_files(root)
    edges: dict[str, set[tuple[str, str]]] = {}

    def sub(module: str) -> str:
        parts = module.split(".")
        return parts[2] if len(parts) > 3 or (len(parts) == 3 and known[module].name == "__init__.py") else ""

    for module, path in known.items():
        room = room_of(module)
        if room not in ROOMS:
            continue
        for imp in imports_of(module, path, root, known):
            if room_of(imp.target) == room and imp.target in known and sub(module) != sub(imp.target):
                edges.setdefault(room, set()).add((sub(module), sub(imp.target)))
    return edges


# Within a room, which of its packages may import which ("": the modules at the room's top),
# as docs/ARCHITECTURE.md draws them; an edge not here is a new dependency to decide on.
SUB_RULES = {
    "readers": {("machine", "nvidia"), ("machine", "nccl"), ("kernel", ""), ("nvidia", ""), ("nccl", "")},  # "": capture.py, how a file is read
    "outputs": {("", "exporters"), ("", "record"), ("exporters", "html"), ("exporters", "record"), ("html", "record"), ("schedulers", "record")},
}


def test_the_sub_rooms_import_only_what_the_table_allows():
    edges = sub_room_edges(ROOT)
    for room in SUB_RULES:
        extra = sorted(edges.get(room, set()) - SUB_RULES[room])
        assert not extra, f"{room}: imports between its packages that SUB_RULES does not allow (from, to): {extra}"
    assert set(edges) <= set(SUB_RULES), f"packages inside rooms SUB_RULES says nothing of: {sorted(set(edges) - set(SUB_RULES))}"


def test_the_sub_rooms_of_a_room_import_one_way():
    """readers/ and outputs/ are grouped in packages (docs/ARCHITECTURE.md): between two of
    them imports go one way only, and no chain of them comes back (the top's modules count
    as one more)."""
    for room, edges in sub_room_edges(ROOT).items():
        graph: dict[str, set[str]] = {}
        for a, b in edges:
            graph.setdefault(a, set()).add(b)
        state: dict[str, int] = {}

        def visit(node: str, path: list[str]) -> None:
            state[node] = 1
            for nxt in sorted(graph.get(node, ())):
                if state.get(nxt) == 1:
                    pytest.fail(f"{room}: the sub-rooms import in a circle: {' -> '.join([*path, node, nxt][path.index(nxt) if nxt in path else 0:]) or nxt}")
                if state.get(nxt) is None:
                    visit(nxt, [*path, node])
            state[node] = 2

        for node in sorted(graph):
            if state.get(node) is None:
                visit(node, [])
    assert ("machine", "nvidia") in sub_room_edges(ROOT)["readers"], "the graph saw no sub-room import: the test is broken"


def test_preflight_holds_only_its_face_main_and_the_rooms():
    found = layout_breaks(ROOT)
    assert not found, "\n".join(found)


# The tests above prove nothing unless they can fail: a small tree with planted faults.

def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


CLEAN = {
    "preflight/__init__.py": '__version__ = "0"\n',
    "preflight/__main__.py": "from preflight.cli.main import main\n",
    "preflight/base/__init__.py": "",
    "preflight/base/units.py": "import math\n",
    "preflight/pipeline/__init__.py": "",
    "preflight/pipeline/check.py": "from preflight.base import units\n",
    "preflight/pipeline/profiles.py": "from preflight.pipeline.check import units\n",
    "preflight/cli/__init__.py": "",
    "preflight/cli/main.py": "def main():\n    from preflight.pipeline import profiles\n",
    "checks/__init__.py": "",
    "checks/shm.py": "from preflight.pipeline.check import units\n",
    "checks/workers/__init__.py": "",
    "checks/workers/_rank.py": "import os\n",
    "checks/workers/smoke.py": "import _rank\nimport torch.distributed as dist\n",
}


def test_a_clean_fake_tree_has_nothing_to_report(tmp_path):
    graph = import_graph(_tree(tmp_path, CLEAN))
    assert cycles(graph) == [] and rule_breaks(graph) == [] and layout_breaks(tmp_path) == []
    assert "preflight.checks.workers._rank" in {i.target for i in graph["preflight.checks.workers.smoke"]}


def test_a_cycle_through_a_type_checking_import_is_found_with_its_path(tmp_path):
    planted = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from preflight.pipeline import profiles\n"
    found = cycles(import_graph(_tree(tmp_path, {**CLEAN, "preflight/pipeline/check.py": planted})))
    assert [str(c).splitlines()[0] for c in found] == [
        "preflight.pipeline.check -> preflight.pipeline.profiles -> preflight.pipeline.check"]
    assert "preflight/pipeline/check.py:3: `from preflight.pipeline import profiles`" in str(found[0])


@pytest.mark.parametrize("back", ["import preflight.base.units\n",
                                  "import importlib\nimportlib.import_module('preflight.base.units')\n"])
def test_a_cycle_through_a_function_level_and_a_relative_import_is_found(tmp_path, back):
    files = {**CLEAN, "preflight/base/units.py": "def f():\n    from . import host\n", "preflight/base/host.py": back}
    found = cycles(import_graph(_tree(tmp_path, files)))
    assert [str(c).splitlines()[0] for c in found] == [
        "preflight.base.host -> preflight.base.units -> preflight.base.host"]


def test_an_upward_import_is_reported_naming_the_file_the_import_and_the_rule(tmp_path):
    files = {**CLEAN, "preflight/base/units.py": "def f():\n    from preflight.pipeline.check import units\n"}
    found = rule_breaks(import_graph(_tree(tmp_path, files)))
    assert found == ["preflight/base/units.py:2: `from preflight.pipeline.check import units` imports "
                     "preflight.pipeline.check (room pipeline): room base may import only base"]


def test_a_check_importing_another_and_an_import_of_the_cli_are_reported(tmp_path):
    files = {**CLEAN, "checks/nccl.py": "from preflight.checks.shm import units\n",
             "preflight/pipeline/check.py": "from preflight.cli import main\n"}
    found = "\n".join(rule_breaks(import_graph(_tree(tmp_path, files))))
    assert "checks/nccl.py:1: `from preflight.checks.shm import units` imports preflight.checks.shm (room checks)" in found
    assert "never another check" in found
    assert "preflight/pipeline/check.py:1: `from preflight.cli import main` imports preflight.cli.main (room cli)" in found


def test_a_worker_importing_preflight_or_a_third_party_package_is_reported(tmp_path):
    files = {**CLEAN, "checks/workers/smoke.py": "import _rank\nimport numpy\nfrom preflight.base import units\n"
                                                  "from preflight.checks.workers import _rank\nfrom . import _rank\n"}
    found = rule_breaks(import_graph(_tree(tmp_path, files)))
    assert [b.split(" imports ")[0] for b in found] == [
        "checks/workers/smoke.py:2: `import numpy`",
        "checks/workers/smoke.py:3: `from preflight.base import units`",
        "checks/workers/smoke.py:4: `from preflight.checks.workers import _rank`",
        "checks/workers/smoke.py:5: `from . import _rank`",
    ]
    assert "a worker script imports only the standard library, torch and its sibling workers" in found[0]
    assert all("runs by path where preflight may not be installed" in b for b in found[1:])


def test_a_module_outside_the_rooms_is_reported(tmp_path):
    _tree(tmp_path, {**CLEAN, "preflight/runner.py": "", "preflight/misc/__init__.py": ""})
    assert layout_breaks(tmp_path) == [
        "preflight/misc: preflight/ holds only __init__.py, __main__.py, base, checkkit, cli, gpuwork, outputs, pipeline, readers; move it into a room",
        "preflight/runner.py: preflight/ holds only __init__.py, __main__.py, base, checkkit, cli, gpuwork, outputs, pipeline, readers; move it into a room",
    ]
    assert any(b.startswith("preflight.misc: in no room") for b in rule_breaks(import_graph(tmp_path)))
