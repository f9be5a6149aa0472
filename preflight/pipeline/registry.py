"""Finds checks through the entry-point group ``preflight.checks``.

Built-in checks are registered there in pyproject.toml exactly as a
third-party plugin would be, so this module never imports a check by name.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import pkgutil
import re
import sys
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import preflight
from preflight.pipeline.check import Check, Context, Result
from preflight.base.errors import UsageError

GROUP = "preflight.checks"
DIST = "gpu-preflight"  # the distribution whose checks are built in (pyproject.toml)


# One scan per import path: each reads the metadata of every installed distribution,
# and a run asks about 30 times (0.35 s a quick run on a GPU image with 200 packages).
_scanned: tuple[tuple[str, ...], dict[str, EntryPoint]] | None = None


def _entry_points() -> dict[str, EntryPoint]:
    global _scanned
    path = tuple(sys.path)
    if _scanned is None or _scanned[0] != path:
        found: dict[str, EntryPoint] = {}
        for ep in entry_points(group=GROUP):
            found.setdefault(ep.name, ep)  # the first installed distribution wins, as importlib orders them
        _scanned = (path, found)
    return dict(_scanned[1])


def names() -> list[str]:
    return sorted(_entry_points())


def preload() -> None:
    """Import the built-in checks' modules now, while the run waits on something else (NVML's
    child): ``load`` then finds them imported. A plugin's code runs only where a run loads it,
    and a module that fails here fails again there, where its stand-in says why."""
    for ep in _entry_points().values():
        if ep.dist is not None and ep.dist.name == DIST:
            try:
                ep.load()
            except Exception:  # noqa: BLE001 - said by load(), at the check's turn
                pass


class BrokenPlugin(Check):
    """Stands in for a check that could not be loaded, so the run reports
    ERROR with the import traceback instead of the agent crashing."""

    description = "(could not be loaded)"

    def __init__(self, name: str, error: BaseException):
        self.name = name  # type: ignore[misc]  # per instance: one stand-in per broken plugin
        self.error = error

    def run(self, ctx: Context) -> Result:
        raise self.error


def check_names(names_given: list[str], what: str) -> None:
    """Exit 2 on a name no installed check has, before any check runs."""
    known = _entry_points()
    for name in names_given:
        if name not in known:
            raise UsageError(f"{what} {name}: no such check; installed checks: {', '.join(sorted(known)) or 'none'}")


def load(name: str) -> Check:
    """An instance of the check registered as ``name``; a stand-in if it is broken."""
    check_names([name], "check")
    ep = _entry_points()[name]
    try:
        cls = ep.load()
        if not (isinstance(cls, type) and issubclass(cls, Check)):
            raise TypeError(f"entry point {ep.value} is not a preflight.pipeline.check.Check subclass")
        if cls.name != name:
            raise TypeError(f"entry point {name!r} loads a check named {cls.name!r}; the two names must agree")
        return cls()
    except Exception as e:  # a broken plugin must not take the agent down
        return BrokenPlugin(name, _moved(e) or e)


def _moved(e: Exception) -> ImportError | None:
    """The error again, naming where the module or name lives now, when a plugin imports
    one of preflight's modules from an older place (preflight/ itself before 0.2.0, or the
    top of readers/ or outputs/ before they were grouped in packages), or a name from the
    module it was split out of (`from preflight.gpuwork.ranks import judge_run`)."""
    missing = e.name if isinstance(e, ModuleNotFoundError) else None
    # Not "from partially initialized module": a circular import, nothing moved.
    named = re.match(r"cannot import name '(\w+)' from '[\w.]+'", str(e)) if type(e) is ImportError and e.name else None
    if named:
        missing = f"{e.name}.{named.group(1)}"  # `from preflight.readers import nvml`: the module is no longer there
    moved = _module_moved(e, missing)
    if moved is None and named and (home := _defined_in(str(e.name), named.group(1))):
        moved = ImportError(f"{e}: preflight moved it to {home}; change the plugin's import", name=e.name)
        moved.__cause__ = e
    return moved


def _module_moved(e: Exception, missing: str | None) -> ModuleNotFoundError | None:
    if not missing or not missing.startswith("preflight.") or missing.count(".") > 2:
        return None
    parent, leaf = missing.rsplit(".", 1)
    found = [m.name for m in _modules() if m.name.rsplit(".", 1)[1] == leaf and m.name != missing and not m.ispkg]
    # Where it went from its old place: under the same package first (outputs.history is
    # outputs.record.history, not cli.history), then anywhere.
    now = sorted(found, key=lambda name: (not name.startswith(parent + "."), name))
    if not now:
        return None
    said = str(e) if isinstance(e, ModuleNotFoundError) else f"No module named {missing!r}"
    moved = ModuleNotFoundError(f"{said}: preflight moved it to {now[0]}; change the plugin's import", name=missing)
    moved.__cause__ = e
    return moved


def _modules() -> list[pkgutil.ModuleInfo]:
    return list(pkgutil.walk_packages(preflight.__path__, "preflight.", onerror=lambda _: None))


def _defined_in(module: str, name: str) -> str | None:
    """The module a split left ``name`` in: of ``module``'s package, defining it at its top level,
    and sharing the start of ``module``'s name (ranks -> ranks_judge, profiles -> profile_detect);
    read from the source, nothing imported (only an import that failed comes here). None where no
    one module is that: a wrong guess would send the plugin's author to an unrelated function."""
    if not module.startswith("preflight.") or not name.isidentifier() or name.startswith("_"):
        return None
    package, leaf = module.rsplit(".", 1)
    homes = []
    for m in _modules():
        if m.ispkg or m.name == module or m.name.rsplit(".", 1)[0] != package:
            continue
        spec = m.module_finder.find_spec(m.name.rsplit(".", 1)[1])  # type: ignore[call-arg]
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        try:
            tree = ast.parse(Path(spec.origin).read_text())
        except (OSError, SyntaxError, ValueError):
            continue
        if name in _top_level(tree):
            homes.append(m.name)
    shared = {home: len(os.path.commonprefix([leaf, home.rsplit(".", 1)[1]])) for home in homes}
    best = max(shared.values(), default=0)
    picks = [home for home, n in shared.items() if n == best]
    return picks[0] if best and len(picks) == 1 else None


def _top_level(tree: ast.Module) -> set[str]:
    """The names a module defines itself (not those it imports)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def builtin() -> list[Check]:
    """The checks this distribution itself provides, cheapest first: a site's plugins left out."""
    return sorted((load(n) for n, ep in _entry_points().items() if ep.dist is not None and ep.dist.name == DIST), key=lambda c: (c.order, c.name))


def installed(order: list[str] | None = None) -> list[Check]:
    """Every installed check, cheapest first; given ``order`` (a profile's
    checks), those of them installed, in that order."""
    checks = sorted((load(name) for name in names()), key=lambda c: (c.order, c.name))
    if order is None:
        return checks
    by_name = {c.name: c for c in checks}
    return [by_name[name] for name in order if name in by_name]
