"""The `preflight` command: flags parsed, then the work handed to the rooms.

main (the console script: `version` and plain `status` without Typer, the
rest through the Typer app), plain (those two commands' bodies, and the exit
codes every command shares), common (the app and its shared options), app
(every command registered), and one module per command group: run (run,
calibrate, selftest), explain (list, show-profile, detect, xid, topology,
nccl-log), integrations (status, serve, slurm-healthcheck, kube-label),
multinode (pairwise).

Imports: any room. Nothing imports the CLI.
"""
