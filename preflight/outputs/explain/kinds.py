"""Which kind of capture a text is, for `preflight explain FILE`.

Each reader says whether a text ``looks_like`` its kind; the kinds are asked
in an order that settles the overlaps. An nccl-tests run prints NCCL INFO
lines among its table when NCCL_DEBUG is set: the table makes it nccl-tests.
`dcgmi diag` and `nvidia-smi -q` print no NCCL or kernel lines. A kernel log
with NVIDIA driver lines is a kernel log (its explainer reports PCIe "limited
by" notices too, so a dmesg holding both loses neither); one with notices and
no driver line is taken for the notices; any other kernel log is a kernel log
with no GPU event, itself an answer. `df` comes last: its header is the least
particular.
"""

from __future__ import annotations

from preflight.readers.nvidia import dcgmi, nvsmi, topo
from preflight.readers import df
from preflight.readers.nccl import nccl_log, nccltests
from preflight.readers.kernel import pcie_notice, xid

ORDER = (
    ("nccl-tests", nccltests.looks_like),
    ("dcgmi-diag", dcgmi.looks_like),
    ("nvidia-smi-q", nvsmi.looks_like),
    ("topology", topo.looks_like),
    ("nccl-log", nccl_log.looks_like),
    ("kernel-log", xid.has_driver_lines),
    ("pcie-notice", pcie_notice.looks_like),
    ("kernel-log", xid.looks_like),
    ("df", df.looks_like),
)
KNOWN = ("nvidia-smi -q, dcgmi diag, nccl-tests output, an nvidia-smi topo -m matrix, an NCCL log, a kernel log "
         "(Xid errors, PCIe 'limited by' notices) and df output for /dev/shm")


def guess(text: str) -> str | None:
    """The kind of capture ``text`` is (a kind in ORDER), or None where no reader knows it."""
    return next((kind for kind, looks_like in ORDER if looks_like(text)), None)
