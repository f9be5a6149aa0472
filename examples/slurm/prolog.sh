#!/bin/bash
# Slurm Prolog: refuse to start a job on a node preflight does not vouch for.
#
# Two steps, each bounded:
# 1. `preflight status`: the last report must vouch (a pass, in this boot,
#    recent enough). The boot gate (standard level) wrote it, or a later run
#    that kept the gate's results.
# 2. `preflight run --level quick`: a fresh look in seconds, with no torch and
#    no GPU work (NVML health, Xid errors since boot, topology, /dev/shm). It
#    writes the node's report: the standard run's results stay in it, marked
#    with their age, and a standard FAIL is never cleared by a quick pass.
#    A non-zero verdict refuses the job, and the report then tells
#    preflight-healthcheck and the metrics why.
#
# Never a refusal for preflight's own reasons:
# - Another preflight run holding the lock (the hourly recheck, an admin's
#   run, the boot gate run again) is waited for 5 s, time for a recheck's
#   quick look to end; this prolog then takes its own. A run still holding it
#   then (the standard level takes a minute or more) is not waited for:
#   `--if-locked skip` exits 0, and the job is judged by the last report,
#   which step 1 found vouching (and recent enough, where PREFLIGHT_MAX_AGE is
#   set: a run that never lets go does not keep a node in service for ever).
#   That run writes its own verdict; if it fails, preflight-healthcheck
#   drains the node with the cause at its next interval (a drain lets the
#   running job finish). Waiting for it would hold the job for minutes;
#   refusing would drain a healthy node "Prolog error", which nothing lifts
#   but a person. The lock is preflight's own setting (--lock-file,
#   PREFLIGHT_LOCK_FILE, the config file), the same for this run, the recheck
#   and the gate, so it is never named here. An admin's standard run on a
#   node in service measures beside the jobs it lets in:
#   drain the node first for figures of the node alone.
# - On a node jobs share (jobs not --exclusive), the quick look judges what
#   the node offers, not what the jobs running on it use. preflight sees them
#   itself, with no Slurm command: every job step runs under a slurmstepd
#   titled "slurmstepd: [JOBID.STEP]" in /proc, and SLURM_JOB_ID (set here)
#   is the job about to start. While another job runs here, /dev/shm's size,
#   filesystem and mode are judged and a 1 MiB segment is written (not 64 MiB:
#   the space is the jobs'); its free space and inodes are only reported, as
#   what is in use may be that job's. The quick level does no GPU work and
#   never judges a GPU by the processes on it, so GPUs other jobs hold are no
#   finding either. With no other job here everything is judged: a /dev/shm
#   too small for any job (64 MiB) fails on any node, and leftovers of crashed
#   jobs filling it fail as soon as no other job runs beside them.
#
# A non-zero exit makes Slurm drain the node with reason "Prolog error" and
# requeue the job (held, unless SchedulerParameters has nohold_on_prolog_fail).
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
#   PREFLIGHT_BUDGET   seconds the quick look may be expected to take [10]: from
#                      this node's last report, else the profile's estimate. A
#                      node whose quick level is expected to take longer refuses
#                      the job, saying so (exit 2): raise it, or drop step 2.
#   Other PREFLIGHT_* settings (PREFLIGHT_PROFILE, PREFLIGHT_CONFIG, ...) and
#   /etc/preflight/config.toml reach step 2 as they reach any run.
set -u

# slurmd runs a prolog with no search path at all.
export PATH="${PATH:+$PATH:}/usr/local/bin:/usr/bin:/bin"
report="${PREFLIGHT_REPORT:-/var/lib/preflight/report.json}"
age=()
[ -n "${PREFLIGHT_MAX_AGE:-}" ] && age=(--max-age "$PREFLIGHT_MAX_AGE")

refuse() {
    msg="preflight prolog: job ${SLURM_JOB_ID:-?} refused on ${SLURMD_NODENAME:-$(hostname -s)}: ${1:-no output} (exit $2)"
    echo "$msg" >&2
    # slurmd does not keep a prolog's output everywhere; the journal does.
    command -v logger >/dev/null && logger -t preflight-prolog -- "$msg"
    exit 1
}

# Bounded, and under slurmd's MessageTimeout (10 s by default): a hung
# filesystem must not hold the job. A timeout (exit 124) is not vouched either.
# On a healthy node this step takes tens of milliseconds.
said=$(timeout 8 preflight status --report "$report" ${age[@]+"${age[@]}"} 2>&1)  # the odd form: bash < 4.4 calls an empty array unbound under set -u
rc=$?
if [ "$rc" -ne 0 ]; then
    case "$said" in
        # A run that died (OOM-killed, say) or that a signal stopped with nothing failed,
        # after a pass that still stands (this boot, within the age allowed): not a verdict
        # on the node. Step 2's fresh look keeps that pass's results and decides; refusing
        # here would drain a healthy node for preflight's own trouble.
        *"; the last run that finished passed ("*) ;;
        *) refuse "$said" "$rc" ;;
    esac
fi

# Not a setting of `run`, which would warn about it.
unset PREFLIGHT_MAX_AGE
# On a healthy node this step takes the quick level's seconds (its checks' time
# is in the report). --budget refuses (exit 2) before anything runs where the
# quick level is not expected to fit; the checks' own deadlines end a wedged
# driver's hang, and timeout is the last stop (the run then records the
# interruption). Another run holding the lock: see the top.
said=$(timeout 30 preflight run --level quick --budget "${PREFLIGHT_BUDGET:-10}" --lock-timeout 5 --if-locked skip -q --report "$report" 2>&1)
rc=$?
[ "$rc" -eq 0 ] || refuse "$(printf '%s' "$said" | tr '\n' ' ')" "$rc"
# A look not taken (another run held the lock) is worth a line in the journal: the job ran on the last report.
case "$said" in
    *"not run:"*) command -v logger >/dev/null && logger -t preflight-prolog -- "preflight prolog: job ${SLURM_JOB_ID:-?} on ${SLURMD_NODENAME:-$(hostname -s)}: $(printf '%s' "$said" | tr '\n' ' ')" ;;
esac
exit 0
