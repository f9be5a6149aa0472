"""The `preflight` command: flags parsed, then the work handed to the rooms.

main (the console script: `version` and plain `status` without Typer, the
rest through the Typer app), plain (those two commands' bodies, and the exit
codes every command shares), common (the options, console, settings and
exit-code wrapper the commands share), app (the Typer app: every command
registered, in --help's order), and one module per command group: run (run,
calibrate, selftest), explain (list, show-profile, detect, xid, topology,
nccl-log), integrations (status, serve, slurm-healthcheck, kube-label),
multinode (pairwise).

Imports: any room. Within: main -> plain and app; app -> plain, common and
the groups; the groups -> common and plain; common -> plain. Nothing but
preflight/__main__.py imports the CLI.
"""
