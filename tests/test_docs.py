"""The documentation as a reader holds it: docs/ARCHITECTURE.md names only files this
repository has; docs/reference.md is what the code writes; every `preflight` command in
README's and docs/'s shell blocks exists with its flags, and every relative link resolves;
README stays short and links to every page of docs/, each of which starts with its title."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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
    subrooms = sorted(p.parent.relative_to(ROOT / "preflight").as_posix() for r in rooms for p in (ROOT / "preflight" / r).glob("*/__init__.py"))
    unheaded = [s for s in subrooms if not re.search(rf"^#### {s}: preflight/{s}/", text, re.M)]
    assert not unheaded, f"ARCHITECTURE.md has no section for the sub-rooms {unheaded}"
    modules = [p.relative_to(ROOT / "preflight").as_posix() for r in rooms for p in (ROOT / "preflight" / r).rglob("*.py")
               if p.name != "__init__.py" and "__pycache__" not in p.parts]
    modules += [f"checks/{p.name}" for p in (ROOT / "checks").glob("*.py") if p.name != "__init__.py"]
    modules += [f"workers/{p.name}" for p in (ROOT / "checks" / "workers").glob("*.py") if p.name != "__init__.py"]
    unnamed = [m for m in sorted(modules) if m not in text]
    assert not unnamed, f"ARCHITECTURE.md does not say what these modules are for: {unnamed}"


def test_the_checks_and_floors_reference_is_what_the_code_writes() -> None:
    """docs/reference.md is generated (preflight/outputs/reference.py): a profile's floor or a
    check's description changed without writing it again fails here, naming the command."""
    from preflight.outputs import reference

    written = (ROOT / "docs" / "reference.md").read_text()
    assert written == reference.render(), "docs/reference.md is stale: python -m preflight.outputs.reference docs/reference.md"
    assert "| `shm_min_bytes` | at least | 17179869184 bytes (16 GiB) |" in written  # a floor, with its unit in words


# --- the docs' commands and links ---------------------------------------------------------------

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_ENDS = {"|", "||", "&&", ";", ">", ">>", "2>", "2>&1", "&", "<"}


def _commands(text: str) -> list[list[str]]:
    """Every `preflight ...` command line in the shell blocks of ``text``, as its words up to
    the first pipe, redirection or `&&`; a leading `$ `, `sudo`, `env` or VAR=value is dropped."""
    import shlex

    out = []
    for lang, body in _FENCE.findall(text):
        if lang not in ("", "sh", "bash", "console", "shell"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line.strip().removeprefix("$ "), comments=True)
            except ValueError:
                continue
            while words and (words[0] in ("sudo", "env", "exec", "time") or re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0])):
                words = words[1:]
            if not words or not (words[0] == "preflight" or words[0].endswith("/preflight")):
                continue
            cut = next((i for i, w in enumerate(words) if w in _ENDS or w.startswith((">", "2>"))), len(words))
            out.append(words[1:cut])
    return out


# Commands that touch no GPU, cluster or file of the node's beyond reading the (test's own) report:
# the docs' lines of these run for real; every other is given --help, which touches nothing.
RUNNABLE = {"list", "show-profile", "version", "status", "history"}


def test_every_preflight_command_in_the_docs_names_a_command_and_flags_that_exist() -> None:
    """Each command in README's and docs/'s shell blocks, given to the CLI itself: for real where it
    can run on a machine without a GPU or a cluster (RUNNABLE), else with --help (which touches
    nothing). A command or a flag that no longer exists (exit 2) or a crash fails here."""
    from typer.testing import CliRunner

    from preflight.cli.app import app

    runner, bad, seen, ran = CliRunner(), [], 0, 0
    for doc in DOCS:
        for words in _commands(doc.read_text()):
            if not words or words[0].startswith("-"):
                continue  # `preflight --help`, `preflight` alone: the app's own
            seen += 1
            real = words[0] in RUNNABLE and not any(w.startswith("[") for w in words)
            ran += real
            # --help first: every flag and the command exist (a real run's exit 2 may be an answer: `status --npd`'s unknown).
            for args in ([*words, "--help"], *([words] if real else [])):
                done = runner.invoke(app, args)
                crashed = done.exception is not None and not isinstance(done.exception, SystemExit)
                if done.exit_code not in ((0,) if args[-1] == "--help" else (0, 1, 2)) or crashed:
                    bad.append(f"{doc.relative_to(ROOT)}: preflight {' '.join(args)}: exit {done.exit_code}: "
                               f"{(done.output.strip().splitlines() or [repr(done.exception)])[-1]}")
                    break
    assert seen > 20 and ran >= 5, "the docs' shell blocks hold almost no preflight command: the parser is broken"
    assert not bad, "\n".join(bad)


def test_every_relative_link_in_the_docs_resolves() -> None:
    bad = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if path and not (doc.parent / path).exists():
                bad.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not bad, "links to nothing:\n" + "\n".join(bad)


# --- README is the way in; docs/ holds a page per task ------------------------------------------

PAGES = ["boot-gate.md", "slurm.md", "kubernetes.md", "prometheus.md", "checks.md", "configuration.md", "explain.md",
         "many-nodes.md", "gpu-kit.md", "writing-a-check.md", "actions-and-history.md", "upgrade.md",
         "verdict.md", "development.md", "reference.md", "ARCHITECTURE.md"]


def test_readme_is_short_enough_to_find_the_deploy_pages_in() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md is {len(lines)} lines: move the detail into a page of docs/"


def test_readme_links_to_every_page_of_the_docs() -> None:
    links = set(re.findall(r"\]\(docs/([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text()))
    assert not set(PAGES) - links, f"README.md does not link to {sorted(set(PAGES) - links)}"
    unlisted = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name not in PAGES)
    assert not unlisted, f"docs/ has pages this test (and so README) does not name: {unlisted}"


@pytest.mark.parametrize("page", PAGES)
def test_each_docs_page_exists_and_starts_with_its_title(page: str) -> None:
    text = (ROOT / "docs" / page).read_text()
    assert re.match(r"# \S", text), f"docs/{page} does not start with a `# ` title"
