"""What the checks in checks/ are built from, shared between them.

figures (one judged number and its floor or ceiling), confirm (a second
reading before a FAIL), outliers (a member against the node's median),
placement (per-rank pinning advice), and a check's own arithmetic where it
would outgrow its file: bandwidth_figures and bandwidth_plan, train_figures and
train_plan, topology_judges and nvlink_pairs, gpu_health (the cuda check's
inventory judge) and the rest docs/ARCHITECTURE.md lists.

Imports: preflight.base, preflight.readers, preflight.pipeline and
preflight.gpuwork; never a check, an output or the CLI.
"""
