"""The vocabulary every room speaks, and the seam to the machine.

errors (UsageError, Interrupted: what the CLI turns into exit codes), signals
(SIGTERM/SIGINT/SIGHUP raised as Interrupted), units (numbers for people),
findings (Status, Measurement, Finding: what a judge says), host (the
filesystem root, the environment, child processes with deadlines), progress
(what the running check is doing, as data), pathtrust (whether another user
could have steered a path), safefile (what root writes at a path a person
gave: atomic, never through a link another user planted).

Imports: the standard library, pydantic and psutil; nothing else of preflight.
"""
