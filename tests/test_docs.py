"""docs/ARCHITECTURE.md is read by someone holding only this repository: every
file it names must be in it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".git", ".venv", "build", "dist", "__pycache__"}


def _repository_files() -> list[str]:
    out = []
    for top in ROOT.iterdir():
        if top.name in SKIP or top.name.endswith(".egg-info"):
            continue
        walk = [top] if top.is_file() else top.rglob("*")
        out += [p.relative_to(ROOT).as_posix() for p in walk if p.is_file() and not SKIP & set(p.parts)]
    return out


def test_architecture_names_only_files_in_the_repository() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    assert "../" not in text, "ARCHITECTURE.md points outside the repository"
    files = _repository_files()
    named = set(re.findall(r"(?<![\w/.-])(\w[\w./-]*\.(?:md|py|toml|sh|yml|yaml|service|timer|json))\b", text))
    assert named, "the pattern found no file names: the test is broken"
    missing = [n for n in sorted(named) if not any(f == n or f.endswith("/" + n) for f in files)]
    assert not missing, f"ARCHITECTURE.md names files this repository does not hold: {missing}"


def test_architecture_draws_every_room_and_module_of_the_tree() -> None:
    """The map matches the tree: each room of preflight/ has its paragraph, and
    every module there and in checks/ is named, as ROOM/NAME.py."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    rooms = sorted(p.name for p in (ROOT / "preflight").iterdir() if (p / "__init__.py").is_file())
    assert rooms, "no room found under preflight/: the test is broken"
    unheaded = [r for r in rooms if not re.search(rf"^### {r}: preflight/{r}/", text, re.M)]
    assert not unheaded, f"ARCHITECTURE.md has no section for the rooms {unheaded}"
    modules = [f"{p.parent.name}/{p.name}" for r in rooms for p in (ROOT / "preflight" / r).glob("*.py") if p.name != "__init__.py"]
    modules += [f"checks/{p.name}" for p in (ROOT / "checks").glob("*.py") if p.name != "__init__.py"]
    modules += [f"workers/{p.name}" for p in (ROOT / "checks" / "workers").glob("*.py") if p.name != "__init__.py"]
    unnamed = [m for m in sorted(modules) if m not in text]
    assert not unnamed, f"ARCHITECTURE.md does not say what these modules are for: {unnamed}"
