"""Errors the CLI turns into exit codes."""


class UsageError(Exception):
    """Bad input from a person or a config file: one line, exit code 2.

    The message names what is wrong and how to fix it.
    """
