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
# A job it refuses leaves the node drained with reason "Prolog error", which
# is not preflight-healthcheck's own drain: resume it by hand once `preflight
# status` vouches again (`scontrol update NodeName=... State=RESUME`).
#
# Environment (optional):
#   PREFLIGHT_REPORT   the report path       [/var/lib/preflight/report.json]
#   PREFLIGHT_MAX_AGE  seconds a pass counts [unset: no limit; a pass from before
#                      the last reboot never counts]. The recheck timer skips a
#                      node whose GPUs are busy, so a node running back-to-back
#                      jobs ages: keep any limit above your longest job, and use
#                      the same one in preflight-healthcheck.
set -u

# slurmd runs a prolog with no search path at all.
export PATH="${PATH:+$PATH:}/usr/local/bin:/usr/bin:/bin"
report="${PREFLIGHT_REPORT:-/var/lib/preflight/report.json}"
age=()
[ -n "${PREFLIGHT_MAX_AGE:-}" ] && age=(--max-age "$PREFLIGHT_MAX_AGE")

# Bounded, and under slurmd's MessageTimeout (10 s by default): a hung
# filesystem must not hold the job. A timeout (exit 124) is not vouched either.
said=$(timeout 8 preflight status --report "$report" ${age[@]+"${age[@]}"} 2>&1)  # the odd form: bash < 4.4 calls an empty array unbound under set -u
rc=$?
if [ "$rc" -ne 0 ]; then
    msg="preflight prolog: job ${SLURM_JOB_ID:-?} refused on ${SLURMD_NODENAME:-$(hostname -s)}: ${said:-no output} (exit $rc)"
    echo "$msg" >&2
    # slurmd does not keep a prolog's output everywhere; the journal does.
    command -v logger >/dev/null && logger -t preflight-prolog -- "$msg"
    exit 1
fi
exit 0
