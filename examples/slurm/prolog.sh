#!/bin/bash
# Slurm Prolog: refuse to start a job on a node the last preflight report does
# not vouch for (a pass, in this boot, recent enough).
#
# It never runs a check: the boot gate and the recheck timer write the report,
# and this reads it in well under a second. A non-zero exit makes Slurm drain
# the node with reason "Prolog error" and requeue the job (held, unless
# SchedulerParameters has nohold_on_prolog_fail).
#
# No Slurm commands here (no scontrol, squeue, sinfo): slurmctld may be waiting
# on this very node to finish its prolog before it answers them, and a prolog
# that calls back into it can stall scheduling for the whole cluster. Draining
# with a reason of our own is preflight-healthcheck's job, on its own schedule.
#
# Environment (optional):
#   PREFLIGHT_REPORT   the report path       [/var/lib/preflight/report.json]
#   PREFLIGHT_MAX_AGE  seconds a pass counts [604800, a week]. The recheck timer
#                      skips a node whose GPUs are busy, so a node running
#                      back-to-back jobs ages: keep this above your longest job.
set -u

# slurmd runs a prolog with no search path at all.
export PATH="${PATH:+$PATH:}/usr/local/bin:/usr/bin:/bin"
report="${PREFLIGHT_REPORT:-/var/lib/preflight/report.json}"
max_age="${PREFLIGHT_MAX_AGE:-604800}"

# Bounded, and under slurmd's MessageTimeout (10 s by default): a hung
# filesystem must not hold the job. A timeout (exit 124) is not vouched either.
said=$(timeout 8 preflight status --report "$report" --max-age "$max_age" 2>&1)
rc=$?
if [ "$rc" -ne 0 ]; then
    msg="preflight prolog: job ${SLURM_JOB_ID:-?} refused on ${SLURMD_NODENAME:-$(hostname -s)}: ${said:-no output} (exit $rc)"
    echo "$msg" >&2
    # slurmd does not keep a prolog's output everywhere; the journal does.
    command -v logger >/dev/null && logger -t preflight-prolog -- "$msg"
    exit 1
fi
exit 0
