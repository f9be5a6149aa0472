"""The bodies of `status` and `version`, and the exit codes every command shares.

Nothing here imports Typer or pydantic: preflight.cli.main runs `status` and
`version` with these alone, and the Typer app's commands call the same
bodies, so both paths answer alike. ``guarded`` turns what a command returns
or raises into preflight's exit codes, on either path.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from preflight.base.errors import Interrupted, UsageError

if TYPE_CHECKING:
    from preflight.outputs.record.last_report import Loaded, Standing


def guarded(command: Callable[..., int], *args: object, **kwargs: object) -> int:
    """What a command returns, or the exit code for what it raised: 2 bad input,
    1 no profile found, 128+N a signal (141: stdout's reader went away), 3 a bug
    (with the traceback)."""
    if sys.stdout is not None and not isinstance(sys.stdout, _Watched):  # None when started with stdout closed (`>&-`)
        sys.stdout = _Watched(sys.stdout)
    try:
        code = command(*args, **kwargs)
        if sys.stdout is not None:
            sys.stdout.flush()  # here, not at exit: a reader gone by then is handled below too
        return code
    except BrokenPipeError:
        # The reader of stdout went away (`| head -1`): stop as a command killed by
        # SIGPIPE does, quietly, with 128+13; the interpreter's last flush goes nowhere.
        stdout_gone()
        return 128 + signal.SIGPIPE
    except UsageError as e:
        console().error(one_line(str(e)))
        return 2
    except StdoutFailed as e:  # where stdout goes is full or failing (`> /dev/full`, a quota)
        stdout_gone()  # the interpreter's last flush must not fail again, and turn the exit code into 120
        console().error(f"cannot write the output: {e.strerror}; free space where it goes (or send it elsewhere)")
        return 2
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:  # a path given (a flag, a variable, a config) the kernel will not take
            console().error(one_line(f"{e.filename or 'a path'}: {e.strerror}; give a shorter path"))
            return 2
        return _broke(e)
    except BaseException as e:
        # DetectionFailed comes from a module only a command that can raise it
        # imports: importing it here would cost every command its start-up.
        profile_detect = sys.modules.get("preflight.pipeline.profile_detect")
        if profile_detect is not None and isinstance(e, profile_detect.DetectionFailed):  # `auto` found no driver or no profile: a finding, not bad input
            console().error(one_line(f"{e.cause}; {e.remedy}"))
            return 1
        if isinstance(e, Interrupted):  # outside a check (detection, lock wait): nothing ran, nothing written
            console().error(f"interrupted by signal {e.signum} before any check ran; no report written")
            return 128 + e.signum
        if not isinstance(e, Exception):
            raise
        return _broke(e)


def one_line(text: str) -> str:
    """An error as one line: a value the person gave (a path, a check name) may hold a line
    break, which would split the error into lines a log reader takes for separate ones."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


class StdoutFailed(OSError):
    """Writing to stdout failed: the disk under a redirect is full, or the device errs."""


class _Watched:
    """stdout, whose write errors say they are stdout's: a full disk under `> out.json` is the
    person's to fix (exit 2), while the same errno from a file a command writes is not this."""

    def __init__(self, stream):  # noqa: ANN001 - sys.stdout, whatever class it is
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise StdoutFailed(e.errno, e.strerror) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            raise StdoutFailed(e.errno, e.strerror) from None

    def __getattr__(self, name: str):  # noqa: ANN204 - fileno, isatty, encoding, buffer: the stream's own
        return getattr(self._stream, name)


def _broke(e: Exception) -> int:
    """The tool broke: one line, and the traceback for a bug report."""
    import traceback

    console().error(f"internal error: {type(e).__name__}: {e} (a bug in preflight; traceback follows)")
    traceback.print_exception(e, file=sys.stderr)
    return 3


def console(quiet: bool = False, verbose: bool = False):  # noqa: ANN202
    """Lines for people, on stderr. Imported when needed: it loads rich, which
    would cost `status` and `version` their start-up."""
    from preflight.outputs.exporters.console import Console

    return Console(quiet=quiet, verbose=verbose)


def emit(text: str) -> None:
    """Data on stdout; a reader that went away (| head) must not change the exit code."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except (BrokenPipeError, ValueError, AttributeError):
        stdout_gone()


def stdout_gone() -> None:
    # Point fd 1 at /dev/null so the interpreter's final flush cannot fail either.
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)


def standing(report: Path | None, config: Path | None, max_age: float | None, node: bool = False) -> tuple[Loaded, Standing]:
    """The last report and what it says about this node now (never runs a check); ``node``: for a
    reader that acts for the node (see report_path)."""
    from preflight.outputs.record import last_report

    if max_age is not None and not 0 < max_age < math.inf:
        raise UsageError(f"--max-age {max_age:g}: give a number of seconds above 0, e.g. 86400 for a day")
    loaded = last_report.load_view(report_path(report, config, node))
    return loaded, last_report.standing(loaded, last_report.this_boot(), last_report.now(), max_age, last_report.booted_at())


def report_path(report: Path | None, config: Path | None, node: bool = False) -> Path:
    """The report the readers read: --report, else the config's, else the default: for a reader
    that acts for the node (``node``: slurm-healthcheck, kube-label, `status --npd`) the node's
    own whoever runs it, for a person's the user's own where they have one (report_paths)."""
    from preflight.pipeline import settings_view
    from preflight.pipeline.report_paths import node_report_path, reader_report_path

    try:
        path = settings_view.report_path(report, config)
    except settings_view.Unsure:
        from preflight.pipeline import settings

        path = settings.load({"report": report}, config=config).report
    return path or (node_report_path() if node else reader_report_path())


def npd_line(reason: str, limit: int = 80) -> str:
    """One line of at most ``limit`` bytes, newline included (NPD's max_output_length), cut on a character."""
    text = " ".join(reason.split())
    if len(text.encode()) + 1 > limit:
        text = text.encode()[: limit - 4].decode(errors="ignore") + "..."
    return text + "\n"


def status(report: Path | None, npd: bool, max_age: float | None, config: Path | None, json_out: bool) -> int:
    """`preflight status`: exit 0 vouched, 1 not; with --npd, 2 where no report is usable."""
    from preflight.outputs.record import last_report

    loaded, st = standing(report, config, max_age, node=npd)
    r = loaded.report
    # What the report asks be done (preflight/base/actions.py), while it speaks for this boot:
    # automation that reads the line switches on its first words.
    act = st.action if str(st.action.action) != "none" else None
    todo = f"[{act.domain}] {act.action}: " if act else ""
    held = r.held_back if r is not None else None  # a scheduler integration's hold on what the report asks
    if npd:
        emit(npd_line(todo + st.reason))
        return {True: 0, False: 1, None: 2}[st.vouched]
    if json_out:
        emit(json.dumps({"vouched": st.vouched, "reason": st.reason, "report_state": str(loaded.state),
                         "action": str(st.action.action), "domain": str(act.domain) if act else None,
                         "action_source": act.source if act else None, "action_check": st.check,
                         "verdict": str(r.verdict) if r else None, "profile": r.profile if r else None,
                         "current_boot": st.current_boot, "age_seconds": st.age_seconds,
                         "run_under_way_since": st.under_way.isoformat() if st.under_way else None,
                         "held_back": {"by": held.by, "said": held.said, "at": held.at.isoformat()} if held else None}, indent=2) + "\n")
    else:
        # A run under way leaves the last verdict standing until it writes its own: said, after it.
        running = f"; a run started at {last_report.utc(st.under_way)} is under way" if st.under_way else ""
        hold = f"\nheld back by {held.by} at {last_report.utc(held.at)}: {held.said}" if held else ""
        emit({True: "vouched", False: "NOT vouched", None: "unknown"}[st.vouched] + f": {todo}{st.reason}{running}{hold}\n")
    return 0 if st.vouched else 1


def version() -> int:
    """`preflight version`: preflight's and what it runs on (torch is looked up, not imported)."""
    from preflight import __version__

    print(f"preflight {__version__}\npython {sys.version.split()[0]}")
    # systemd/ and examples/ are package data (pyproject): a wheel puts them in
    # the package, an editable install leaves them at the checkout's root.
    here = Path(__file__).parent.parent  # the package
    print(f"units and examples: {here if (here / 'systemd').is_dir() else here.parent}")
    for dist in ("torch", "nvidia-ml-py", "pydantic", "typer"):
        try:
            print(f"{dist} {dist_version(dist)}")
        except LookupError:
            print(f"{dist} not installed")
    return 0


def dist_version(name: str) -> str | None:
    """``importlib.metadata.version(name)``, LookupError where it is not installed.

    Read as importlib.metadata's path finder reads it (the first NAME-*.dist-info
    or .egg-info on sys.path, its METADATA or PKG-INFO, the Version header)
    without importing importlib.metadata and email, which cost `version` more
    than the rest of it; a zip on sys.path, another finder or an odd file is
    left to importlib.metadata itself."""
    from importlib.machinery import PathFinder

    try:
        if any(getattr(f, "find_distributions", None) and f is not PathFinder for f in sys.meta_path):
            raise _Odd
        wanted = _normalize(name)
        for entry in sys.path:
            root = entry or "."
            if os.path.basename(root).lower().endswith(".egg"):
                raise _Odd  # an egg: its EGG-INFO names no distribution
            try:
                children = os.listdir(root)
            except OSError:
                if os.path.exists(root):
                    raise _Odd from None  # a zip: importlib.metadata reads inside it
                continue
            for child in children:
                low = child.lower()
                if low.endswith((".dist-info", ".egg-info")) and _normalize(low.rpartition(".")[0].partition("-")[0]) == wanted:
                    return _version_header(os.path.join(root, child))
        raise LookupError(name)
    except (_Odd, ValueError):  # ValueError: METADATA not UTF-8
        from importlib import metadata

        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            raise LookupError(name) from None


class _Odd(Exception):
    """Something only importlib.metadata reads as it does."""


_HEADER_NAME = re.compile(r"[\041-\071\073-\176]+")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower().replace("-", "_")


def _version_header(info: str) -> str:
    for text in _metadata_texts(info):
        if text:
            break
    else:
        raise _Odd
    lines = re.split(r"\r\n|\r|\n", text)  # as the email parser splits them
    for line, after in zip(lines, [*lines[1:], ""]):
        if not line.strip():
            break  # the headers end at the first blank line
        key, colon, value = line.partition(":")
        if not colon or not _HEADER_NAME.fullmatch(key):
            raise _Odd  # a folded or malformed header: the email parser's call
        if key.lower() == "version":
            if after[:1] in (" ", "\t"):
                raise _Odd  # a folded header
            return value.lstrip(" \t")
    raise _Odd


def _metadata_texts(info: str):  # noqa: ANN202
    for path in (os.path.join(info, "METADATA"), os.path.join(info, "PKG-INFO"), info):
        try:
            with open(path, encoding="utf-8") as f:
                yield f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
            continue
