"""The `preflight` command: parses flags and wires the modules together.

Exit codes: 0 pass (warnings allowed), 1 a check failed, 2 usage or config
error, 3 preflight itself broke, 128+N stopped by signal N.
Heavy modules are imported inside commands so `preflight --help` stays fast.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional

import typer

from preflight.errors import UsageError

app = typer.Typer(
    name="preflight",
    help="Decide, in seconds, whether this GPU node will run a training job at full speed.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

ProfileOpt = Annotated[Optional[str], typer.Option("--profile", "-p", help="Profile name, or 'auto' to pick by GPU model. [default: auto]")]
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="Config TOML. [default: $PREFLIGHT_CONFIG, else /etc/preflight/config.toml if present]")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")]


def _console(quiet: bool = False, verbose: bool = False):  # noqa: ANN202
    from preflight.console import Console

    return Console(quiet=quiet, verbose=verbose)


def _settings(config: Optional[Path], **flags: object):  # noqa: ANN202
    from preflight import settings

    return settings.load(flags, config=config)


def _exit_codes(command: Callable[..., int]) -> Callable[..., None]:
    """Turn what a command returns or raises into preflight's exit codes."""

    @functools.wraps(command)
    def wrapper(*args: object, **kwargs: object) -> None:
        from preflight.profiles import DetectionFailed
        from preflight.runner import Interrupted

        try:
            code = command(*args, **kwargs)
        except UsageError as e:
            _console().error(str(e))
            code = 2
        except DetectionFailed as e:  # `auto` found no driver or no profile: a finding, not bad input
            _console().error(f"{e.cause}; {e.remedy}")
            code = 1
        except Interrupted as e:  # outside a check (detection, lock wait): nothing ran, nothing written
            _console().error(f"interrupted by signal {e.signum} before any check ran; no report written")
            code = 128 + e.signum
        except Exception as e:  # the tool broke: one line, and the traceback for a bug report
            _console().error(f"internal error: {type(e).__name__}: {e} (a bug in preflight; traceback follows)")
            traceback.print_exc(file=sys.stderr)
            code = 3
        raise typer.Exit(code)

    return wrapper


class _Signals:
    """SIGTERM/SIGINT/SIGHUP raise Interrupted in the main thread, so the runner
    can kill what the running check started and still write the report."""

    def __enter__(self) -> None:
        from preflight.runner import Interrupted

        def handler(signum: int, _frame: object) -> None:
            raise Interrupted(signum)

        self.saved = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}

    def __exit__(self, *_: object) -> None:
        for s, h in self.saved.items():
            signal.signal(s, h)


@app.command()
@_exit_codes
def run(
    profile: ProfileOpt = None,
    only: Annotated[Optional[list[str]], typer.Option("--only", help="Run only these checks (repeat, or comma-separate).")] = None,
    skip: Annotated[Optional[list[str]], typer.Option("--skip", help="Leave out these checks.")] = None,
    keep_going: Annotated[Optional[bool], typer.Option("--keep-going/--fail-fast", help="Run every check even after a failure. [default: fail-fast]")] = None,
    json_out: JsonOpt = False,
    report: Annotated[Optional[Path], typer.Option("--report", help="Write the JSON report here, atomically.")] = None,
    config: ConfigOpt = None,
    lock_file: Annotated[Optional[Path], typer.Option("--lock-file", help="Lock that keeps runs apart. [default: /run/lock/preflight.lock]")] = None,
    lock_timeout: Annotated[Optional[float], typer.Option("--lock-timeout", help="Seconds to wait for another run to finish. [default: 60]")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only problems and the verdict.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print every measurement and cause.")] = False,
) -> int:
    """Run the profile's checks in order and print the verdict."""
    from preflight import pipeline, report as reports, settings as settings_mod
    from preflight.lock import run_lock

    console = _console(quiet, verbose)
    s = _settings(
        config, profile=profile, only=only, skip=skip, keep_going=keep_going,
        report=report, lock_file=lock_file, lock_timeout=lock_timeout,
    )
    for name in settings_mod.unknown_env():
        console.note(f"warning: {name} is not a preflight setting and is ignored")
    report_path = reports.check_writable(s.report) if s.report is not None else None
    with _Signals():
        the_plan = pipeline.plan(s)  # may ask NVML (bounded), so it runs under the handlers too
        with run_lock(s.lock_file, s.lock_timeout, lambda who: console.note(f"waiting for {who} to release {s.lock_file}")):
            result = pipeline.execute(the_plan, s, console)
            if report_path is not None:
                try:
                    reports.write_atomic(report_path, result.model_dump_json(indent=2) + "\n")
                except OSError as e:
                    # The verdict still stands and is printed; a failed gate stays failed, a pass becomes 3.
                    console.error(f"could not write the report to {s.report}: {e.strerror or e}; the previous report is unchanged")
                    result.exit_code = result.exit_code or reports.EXIT_CODES[reports.Verdict.ERROR]
    console.summary(result)
    if json_out:
        _emit(result.model_dump_json(indent=2) + "\n")
    return result.exit_code


def _emit(text: str) -> None:
    """Data on stdout; a reader that went away (| head) must not change the exit code."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except (BrokenPipeError, ValueError, AttributeError):
        # Point fd 1 at /dev/null so the interpreter's final flush cannot fail either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)


@app.command("list")
@_exit_codes
def list_checks(profile: ProfileOpt = None, config: ConfigOpt = None, json_out: JsonOpt = False) -> int:
    """The installed checks, cheapest first, with what each verifies."""
    from preflight import pipeline, registry

    settings = _settings(config, profile=profile)  # a bad config is refused here too
    checks = [registry.load(name) for name in registry.names()]
    checks.sort(key=lambda c: (c.order, c.name))
    if profile is not None:
        resolved = pipeline.resolve_profile(settings)
        by_name = {c.name: c for c in checks}
        checks = [by_name[name] for name in resolved.checks if name in by_name]
    rows = [
        {"name": c.name, "description": c.description, "requires": list(c.requires), "timeout_seconds": c.timeout_seconds}
        for c in checks
    ]
    if json_out:
        print(json.dumps(rows, indent=2))
        return 0
    width = max((len(r["name"]) for r in rows), default=0)
    for r in rows:
        needs = f" (after {', '.join(r['requires'])})" if r["requires"] else ""
        print(f"{r['name']:<{width}}  {r['description']}{needs}")
    return 0


@app.command("show-profile")
@_exit_codes
def show_profile(
    name: Annotated[Optional[str], typer.Argument(help="Profile name. [default: the configured one, else auto]")] = None,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
) -> int:
    """The resolved profile: checks, expected GPUs, and every floor with where its value came from."""
    from preflight import pipeline
    from preflight.units import fmt_bytes

    p = pipeline.resolve_profile(_settings(config, profile=name))
    if json_out:
        print(p.model_dump_json(indent=2))
        return 0
    print(f"profile {p.name} ({p.chosen_because})\n  file: {p.path}\n  {p.description}")
    print(f"  GPUs expected: {p.gpu_count}\n  checks, in order: {', '.join(p.checks)}\n  floors:")
    for fname, f in p.floors.items():
        human = f" ({fmt_bytes(f.value)})" if f.unit == "bytes" else ""
        kind = "at least" if f.bound == "min" else "at most"
        value = f"{f.value:.0f}" if f.value.is_integer() else f"{f.value:g}"
        print(f"    {fname}: {kind} {value} {f.unit}{human}\n      value from: {f.origin}\n      source: {f.source}")
    return 0


@app.command()
@_exit_codes
def version() -> int:
    """Versions of preflight and what it runs on (torch is looked up, not imported)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    from preflight import __version__

    print(f"preflight {__version__}\npython {sys.version.split()[0]}")
    for dist in ("torch", "nvidia-ml-py", "pydantic", "typer"):
        try:
            print(f"{dist} {dist_version(dist)}")
        except PackageNotFoundError:
            print(f"{dist} not installed")
    return 0


def main() -> None:
    app()
