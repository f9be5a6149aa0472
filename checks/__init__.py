"""Built-in checks, installed as ``preflight.checks``; one file per check.

Each is registered in pyproject.toml's ``preflight.checks`` entry-point group,
the same way a third-party check registers.
"""
