"""Reading TOML files people write, with errors that name the file, line and key."""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from preflight.base import pathtrust
from preflight.base.errors import UsageError
from preflight.readers import capture

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MAX_BYTES = 1 << 20  # far beyond any real config or profile
# The profiles installed with preflight: whoever owns them owns its code too, so refusing them adds nothing.
SHIPPED = Path(__file__).parent / "profiles"
_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^\s*(\"[^\"]*\"|'[^']*'|[A-Za-z0-9_.\-\" ]+?)\s*=")


def load(path: Path, what: str) -> tuple[dict[str, Any], str]:
    """Parse ``path``; ``what`` ("config", "profile") starts every error message."""
    try:
        # Opened without blocking and judged by what was opened: a FIFO would block, /dev/zero never ends.
        fd, st = capture.open_nonblocking(path)
        try:
            if stat.S_ISDIR(st.st_mode):
                raise UsageError(f"{what} file {path} is a directory, not a TOML file")
            if not stat.S_ISREG(st.st_mode):
                raise UsageError(f"{what} file {path} is not a regular file")
            if st.st_size > MAX_BYTES:
                raise UsageError(f"{what} file {path} is {st.st_size} bytes; a {what} file is at most {MAX_BYTES // 1024} KiB")
            raw = capture.read_regular(fd, MAX_BYTES + 1)
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise UsageError(f"{what} file {path} does not exist") from None
    except OSError as e:
        raise UsageError(f"{what} file {path} cannot be read: {e.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise UsageError(f"{what} file {path} is over {MAX_BYTES // 1024} KiB; a {what} file is at most that")
    # A config or profile sets floors, paths and the interpreter root runs: one another user
    # could edit or swap would steer the gate.
    if os.geteuid() == 0 and Path(os.path.abspath(path)).parent != SHIPPED and (why := pathtrust.read_steerable(path, st)):
        raise UsageError(f"{what} file {path}: another user could change it ({why}); as root preflight reads only "
                         f"{what} files only root can change: chown root and chmod go-w it and the directories above it")
    try:
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError:
        raise UsageError(f"{what} file {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{what} file {path}: invalid TOML: {e}") from None
    except ValueError as e:  # an integer of thousands of digits: int() refuses it inside tomllib
        raise UsageError(f"{what} file {path}: invalid TOML: {e}") from None
    except RecursionError:  # tomllib recurses once per level of nesting
        raise UsageError(too_deep(what, path)) from None
    if depth(data) > MAX_DEPTH:
        raise UsageError(too_deep(what, path))
    return data, text


# The deepest a profile goes is 4 (a figure's band in [outliers.figures.NAME], a level's list of
# checks); a config, 2 ([floors.NAME]). A file past this is not one a person wrote for preflight.
MAX_DEPTH = 16


def depth(value: Any) -> int:
    """How deep tables and arrays nest in ``value`` (a scalar is 0), counted without recursion."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list):
            deepest = max(deepest, d + 1)
            todo += [(item, d + 1) for item in v]
    return deepest


def too_deep(what: str, path: Path) -> str:
    return f"{what} file {path} nests tables or arrays more than {MAX_DEPTH} deep; no config or profile goes past 4 ([outliers.figures.NAME], [levels.NAME] checks)"


def _unquote(key: str) -> str:
    return ".".join(part.strip().strip("\"'") for part in key.split("."))


def line_of(text: str, loc: tuple[str | int, ...]) -> int | None:
    """The 1-based line where the key at ``loc`` is set, or its table begins."""
    keys = [str(k) for k in loc if not isinstance(k, int)]
    while keys:
        target = ".".join(keys)
        current = ""
        for n, line in enumerate(text.splitlines(), 1):
            if m := _HEADER.match(line):
                current = _unquote(m.group(1))
                if current == target:
                    return n
                continue
            if m := _KEY.match(line):
                full = _unquote(m.group(1))
                full = f"{current}.{full}" if current else full
                if full == target:
                    return n
        keys.pop()
    return None


UNION_TAGS = ("number", "table")


def validation_message(err: ValidationError, path: Path, text: str, what: str) -> str:
    """One line for the first error: file, line, key and what is wrong."""
    first = err.errors(include_url=False)[0]
    # A tagged union (a floor: number or table) adds its tag to the path; the file has no such key.
    loc = tuple(k for k in first["loc"] if k not in UNION_TAGS)
    key = ".".join(str(k) for k in loc) or "(top level)"
    line = line_of(text, loc)
    where = f"{path} line {line}" if line else str(path)
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown key (check the spelling against the documented keys)"
    elif first["type"] == "missing":
        msg = "required key is missing"
    return f"{what} {where}: {key}: {msg}"
