"""Errors the CLI turns into exit codes."""

import signal


class UsageError(Exception):
    """Bad input from a person or a config file: one line, exit code 2.

    The message names what is wrong and how to fix it.
    """


class Interrupted(BaseException):
    """Raised in the main thread on SIGTERM/SIGINT/SIGHUP (preflight.base.signals.interrupting).

    A BaseException so that no check's ``except Exception`` swallows it.
    """

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def signal_name(signum: int) -> str:
    """SIGTERM for 15: what a person reads in "interrupted by SIGTERM"."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
