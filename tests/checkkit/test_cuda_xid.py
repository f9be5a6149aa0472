"""A job's own Xids told from the node's (preflight/checkkit/cuda_xid.py), on kernel log lines
as the driver prints them; the cuda check's verdicts on them: tests/checks/test_cuda.py."""

from __future__ import annotations

from preflight.checkkit import cuda_xid
from preflight.readers.kernel.xid import parse


def test_the_jobs_are_the_catalogs_restart_app_xids_and_the_resets_that_follow_them():
    log = parse(
        "NVRM: Xid (PCI:0000:1b:00): 43, pid=9, name=python, Ch 00000008\n"  # before any job's Xid: the node's
        "NVRM: Xid (PCI:0000:1b:00): 31, pid=4242, name=python, Ch 00000008, intr 00000000. MMU Fault\n"
        "NVRM: Xid (PCI:0000:1b:00): 43, pid=4242, name=python, Ch 00000008\n"
        "NVRM: Xid (PCI:0000:43:00): 45, pid=4242, name=python, Ch 00000008\n"  # another GPU: not this fault's
        "NVRM: Xid (PCI:0000:1b:00): 45, pid='<unknown>', name=<unknown>, Ch 00000008\n"  # no pid printed: this GPU's fault
        "NVRM: Xid (PCI:0000:1b:00): 79, pid=4242, name=python, GPU has fallen off the bus.\n"  # never a job's
    )
    assert [(e.code, e.line) for e in cuda_xid.the_jobs(log)] == [(31, 2), (43, 3), (45, 5)]
    assert cuda_xid.the_jobs(parse("nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error\n")) == []
