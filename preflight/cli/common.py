"""What every command module of the CLI shares: the options several commands
take, the help layout, the console and settings, and preflight's exit codes.

The names keep their underscore: they are the CLI's own helpers, not the
package's interface.
"""

# No `from __future__ import annotations`: Typer would then evaluate every
# command's annotations from strings at each start, a sixth of --help's time.
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional

import typer

from preflight.cli import plain


class _Command(typer.core.TyperCommand):
    """Lists an argument by its metavar alone: typer adds the Python type ("FILE <path>")."""

    def format_options(self, ctx, formatter) -> None:  # noqa: ANN001
        sections: dict[str, list[tuple[str, str]]] = {"argument": [], "option": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and param.param_type_name in sections:
                name = param.metavar if param.param_type_name == "argument" and param.metavar else record[0]
                sections[param.param_type_name].append((name, record[1]))
        for title, kind in (("Arguments", "argument"), ("Options", "option")):
            if sections[kind]:
                with formatter.section(title):
                    formatter.write_dl(sections[kind])

    def collect_usage_pieces(self, ctx) -> list[str]:  # noqa: ANN001
        # typer writes a required argument as "{FILE}"; a usage line says FILE
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p for p in super().collect_usage_pieces(ctx)]


def _profile_names() -> str:
    """The installed profiles, for --help. A profile's name is its file's name,
    so a directory listing says it: no profile is parsed for a --help."""
    names = set()
    for folder in (Path(__file__).parent.parent / "pipeline" / "profiles", os.environ.get("PREFLIGHT_PROFILES_DIR") or "/etc/preflight/profiles"):
        try:
            names.update(e.name[: -len(".toml")] for e in os.scandir(folder) if e.name.endswith(".toml"))
        except OSError:  # no site profiles: the built-in ones are still listed
            pass
    return ", ".join(sorted(names))


PROFILE_HELP = f"auto (pick by GPU model), or one of: {_profile_names()}."
ProfileOpt = Annotated[Optional[str], typer.Option("--profile", "-p", metavar="NAME", help=f"Profile: {PROFILE_HELP} [default: auto]")]
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", metavar="FILE", help="Config TOML. [default: $PREFLIGHT_CONFIG, else /etc/preflight/config.toml if present]")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")]
# Facts from a JSON file instead of NVML: for tests and demos, so not in --help.
FakeOpt = Annotated[Optional[Path], typer.Option("--nvml-fake", metavar="FILE", hidden=True)]


def _settings(config: Optional[Path], **flags: object):  # noqa: ANN202
    from preflight.pipeline import settings

    return settings.load(flags, config=config)


def _exit_codes(command: Callable[..., int]) -> Callable[..., None]:
    """Turn what a command returns or raises into preflight's exit codes."""

    @functools.wraps(command)
    def wrapper(*args: object, **kwargs: object) -> None:
        raise typer.Exit(plain.guarded(command, *args, **kwargs))

    return wrapper


_console = plain.console  # lines for people, on stderr
_emit = plain.emit  # data on stdout; a reader that went away (| head) must not change the exit code
