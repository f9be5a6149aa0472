"""Whether another user decides what a Python interpreter root runs does: `pathtrust.steerable`
for the interpreter, and for everything it reads and runs before any code of preflight's.

Found by their places, never by asking the interpreter, which would run its .pth files first:
a script's `#!` interpreter and the variables its `env` line sets (PYTHONPATH, LD_PRELOAD...);
the venv's pyvenv.cfg and its `home`, the install whose standard library a venv loads; the site
directories it imports from, whose .pth files it runs at start-up and whose path lines put
directories on sys.path (the base interpreter's only where the venv includes them,
include-system-site-packages; Debian's dist-packages and /usr/local's); and the directories
beside it where another user could add a pyvenv.cfg. A shell wrapper (`#!/bin/sh`) is judged by
its shell and its own file only: what it execs is its text's to say.
"""

from __future__ import annotations

import os
import ast
import re
import shlex
import shutil
import stat
from pathlib import Path

from preflight.base.pathtrust import acl_writers, steerable

MAX_SHEBANGS = 4  # the kernel's own limit on nested interpreters (BINPRM_MAX_RECURSION)
# What an `env` line may set that decides what Python imports or the loader maps, paths all.
PATH_VARIABLES = ("PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONSTARTUP", "PYTHONPYCACHEPREFIX", "LD_PRELOAD", "LD_LIBRARY_PATH")
SEARCHED = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH")  # directories searched by name, where an added file is found
ENV_VALUED = ("-u", "--unset", "-C", "--chdir", "-P", "-a", "--argv0")  # GNU and BSD env's options that take a value


def interpreter_steerable(python: Path | str, _depth: int = 0) -> str | None:
    """Why another user decides what the interpreter ``python`` runs as root (the module's doc), or None."""
    if why := steerable(python):
        return why
    if (script := shebang(python)) is not None:
        # A script (a wrapper of the training environment's python): the kernel runs the interpreter
        # its #! line names, whose owner decides what root runs, with what its env line sets.
        interpreter, assigned = script
        if why := _assigned_steerable(python, assigned):
            return why
        if _depth >= MAX_SHEBANGS:
            return f"{python}: #! lines nested too deep to follow"
        return interpreter_steerable(interpreter, _depth + 1)
    given, real = Path(os.path.abspath(python)), Path(os.path.realpath(python))
    # The version where the file names it (python3.11), else every python3.N the prefix holds.
    version = real.name if re.fullmatch(r"python3\.[0-9]+", real.name) else "python3.*"
    venv, base = given.parent.parent, real.parent.parent
    bases = [base]
    places: list[Path] = []
    system_site = True
    if os.path.lexists(venv / "pyvenv.cfg"):
        if why := steerable(venv / "pyvenv.cfg"):
            return why
        try:
            cfg = (venv / "pyvenv.cfg").read_text(errors="replace")[:65536]
        except OSError:
            cfg = ""
        system_site = bool(re.search(r"^\s*include-system-site-packages\s*=\s*true\s*$", cfg, re.M | re.I))
        places += sorted(venv.glob(f"lib*/{version}/site-packages"))
        # The venv's `home` (a key Python reads in any case) is where it looks for its standard library
        # (getpath), whatever bin/python is: a copy (`venv --copies`) never leads there by a link, and
        # its base install's owner would write the os.py and sitecustomize root imports first.
        if (home := re.search(r"^\s*home\s*=\s*(.+?)\s*$", cfg, re.M | re.I)) and home[1].startswith("/"):
            if why := steerable(home[1]):
                return why
            bases.append(Path(os.path.realpath(home[1])).parent)
    bases = list(dict.fromkeys(bases))
    places += [p for b in bases for p in sorted(b.glob(f"lib*/{version}"))]
    if not os.environ.get("PYTHONNOUSERSITE"):
        # The user site of $HOME, which root keeps under `sudo -E`: another user's ~/.local then.
        places += sorted(Path(os.path.expanduser("~")).glob(f".local/lib/{version}/site-packages"))
    if system_site:
        for pattern in (f"lib*/{version}/site-packages", f"lib*/{version}/dist-packages", "lib*/python3/dist-packages", f"local/lib*/{version}/dist-packages"):
            places += [p for b in bases for p in sorted(b.glob(pattern))]
    for place in dict.fromkeys(places):
        if why := steerable(place) or _open_to_additions(place):
            return why
    # Python looks for a pyvenv.cfg beside the interpreter and one level up (getpath) before any
    # site directory: one another user adds there names the standard library it then imports.
    for place in (given.parent, given.parent.parent):
        if not os.path.lexists(place / "pyvenv.cfg") and (why := _open_to_additions(place)):
            return why
    return None


def shebang(path: Path | str) -> tuple[str, dict[str, str]] | None:
    """The interpreter the #! line of the script at ``path`` names, and what its `env` sets
    (``shebang_of``); None where ``path`` is no script."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    return shebang_of(head.split(b"\n", 1)[0].decode(errors="replace")) if head.startswith(b"#!") else None


def shebang_of(line: str) -> tuple[str, dict[str, str]] | None:
    """A #! line's interpreter and what its `env` sets: through /usr/bin/env, the program it finds on
    PATH, read past env's options as env reads them, `-S` splitting the rest."""
    # The kernel passes what follows the interpreter as one argument: split only where env's -S does.
    interpreter, _, argument = line.removeprefix("#!").strip().replace("\t", " ").partition(" ")
    if not interpreter:
        return None
    if os.path.basename(interpreter) != "env":
        return interpreter, {}
    words, assigned, name = [argument.strip()], {}, None
    environ = dict(os.environ)
    while words:
        w = words.pop(0)
        if w in ("-S", "--split-string") or w.startswith(("-S", "--split-string=")):
            rest = w.partition("=")[2] if w.startswith("--split-string=") else w[2:] if w.startswith("-S") and w != "-S" else ""
            words = _split(" ".join([rest, *words]))
        elif " " in w and not name:
            return w, assigned  # no -S: env looks for a program of that whole name, which is none
        elif w in ENV_VALUED:
            words = words[1:]
        elif w.startswith("-"):
            continue  # -i, -0, -v, --unset=NAME, -uNAME, -CDIR: nothing to judge
        elif "=" in w:
            key, _, value = w.partition("=")
            # env -S expands ${NAME} from the environment the program inherits, the line's own settings in it.
            assigned[key] = environ[key] = re.sub(r"\$\{(\w+)\}", lambda m: environ.get(m[1], ""), value)
        else:
            name = w
            break
    if name is None:
        return interpreter, assigned  # env alone prints the environment: no interpreter but env itself
    # env looks the program up on the PATH its line sets, where it sets one.
    return (shutil.which(name, path=assigned.get("PATH")) or name), assigned


def _split(text: str) -> list[str]:
    """env -S's words: quotes as the shell takes them (`env -S "python3" -u` runs python3)."""
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def _assigned_steerable(script: Path | str, assigned: dict[str, str]) -> str | None:
    """Why another user decides a path the #! line's env sets for the interpreter, or None."""
    for key in PATH_VARIABLES:
        for entry in re.split(r"[:\s]+", assigned.get(key, "")):
            # A library named bare in LD_PRELOAD is looked up in the loader's own directories, not the
            # working directory; ${NAME} is expanded as env expands it (shebang_of).
            if not entry or (key == "LD_PRELOAD" and "/" not in entry):
                continue
            if not entry.startswith("/"):
                return f"{script}'s #! line sets {key} to a path from the working directory ({entry})"
            # A directory searched for programs, modules or libraries is another user's where they may add to it.
            if why := steerable(entry) or (key in SEARCHED and _others_may_add(Path(entry))):
                return f"{script}'s #! line sets {key}: {why}"
    return None


def _open_to_additions(place: Path) -> str | None:
    """Why another user could add what Python runs from the import directory ``place``: it lets
    them create names there (a sticky bit keeps them from replacing root's entries, never from
    adding a .pth file or a sitecustomize.py of their own), a .pth file or a sitecustomize.py
    there, each run at start-up, is one they have a say in, or a .pth file's path line puts a
    directory of theirs on sys.path (`pip install -e` of another user's checkout)."""
    if why := _others_may_add(place):
        return why
    pths = sorted(p.name for p in place.glob("*.pth"))
    finders = sorted(p.name for p in place.glob("__editable__*_finder.py"))
    for name in [*pths, *finders, "sitecustomize.py", "usercustomize.py"]:
        if os.path.lexists(place / name) and (why := steerable(place / name)):
            return why
    for name in pths:
        if why := _pth_paths_steerable(place, name):
            return why
    for name in finders:
        if why := _finder_steerable(place / name):
            return why
    return None


def _others_may_add(place: Path) -> str | None:
    """Why another user may create names in the directory ``place``, sticky or not, or None."""
    try:
        st = os.stat(place)
    except OSError:
        return None
    writers = stat.S_IWOTH | (stat.S_IWGRP if st.st_gid != 0 else 0)
    if st.st_mode & writers:
        who = "every user" if st.st_mode & stat.S_IWOTH else "its group"
        return f"{place} is writable by {who}, who may add a .pth file, a module or a pyvenv.cfg Python reads there"
    return acl_writers(place)


def _finder_steerable(finder: Path) -> str | None:
    """Why another user decides a package an editable install's finder imports from (setuptools 64
    and on: a .pth line `import __editable___X_finder` and, in the finder, ``MAPPING`` from each
    package to the checkout's directory, which a path line would have named), or None."""
    try:
        tree = ast.parse(finder.read_text(errors="replace")[:1 << 20])
    except (OSError, SyntaxError, ValueError, MemoryError, RecursionError):
        return f"{finder} cannot be read as an editable install's finder, so what it imports is unknown"
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(target, ast.Name) and target.id == "MAPPING" and node.value is not None:
            try:
                mapping = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return f"{finder}'s MAPPING is no literal mapping, so what it imports is unknown"
            for directory in (mapping.values() if isinstance(mapping, dict) else []):
                if isinstance(directory, str) and (why := steerable(directory)):
                    return f"{finder} imports from {directory}: {why}"
    return None


def _pth_paths_steerable(place: Path, name: str) -> str | None:
    """Why another user decides a directory the .pth file ``name`` puts on sys.path: as site.addpackage
    reads it, each line that is neither blank, a comment nor an `import` line, joined to ``place``."""
    try:
        lines = (place / name).read_text(errors="replace")[:65536].splitlines()
    except OSError:
        return None
    for line in lines:
        if not line.strip() or line.startswith("#") or line.startswith(("import ", "import\t")):
            continue
        directory = os.path.join(place, line.rstrip())
        if os.path.exists(directory) and (why := steerable(directory)):
            return f"{place / name} puts {directory} on the import path: {why}"
    return None
