"""`preflight explain FILE`: one front door for a saved capture.

The file is read once (bounded, and refused if it is not text: preflight/readers/capture.py), its kind decided from its
text (preflight/outputs/explain/kinds.py), and handed to that kind's explainer
(``outputs/explain_<kind>.py``), which reads it with its reader and judges it
with the checks' own judges. A file no reader can place is bad input: one
line naming the kinds preflight knows, exit 2.
"""

from __future__ import annotations

from pathlib import Path

from preflight.base.errors import UsageError
from preflight.outputs.explain import explain_dcgmi, explain_df, explain_nccl_log, explain_nccltests, explain_nvsmi, explain_pcie_notice, explain_topology, explain_xid
from preflight.outputs.explain.explained import Explained
from preflight.pipeline import plan as pipeline
from preflight.pipeline.settings import Settings
from preflight.readers import capture
from preflight.outputs.explain import kinds

# The largest capture worth reading: a whole-node kernel log or a long NCCL_DEBUG=INFO run.
# Bigger files are refused at once (read_text stops one byte past the limit).
MAX_BYTES = 64 << 20
EXPLAINERS = {"nvidia-smi-q": explain_nvsmi, "dcgmi-diag": explain_dcgmi, "nccl-tests": explain_nccltests, "pcie-notice": explain_pcie_notice,
              "df": explain_df, "topology": explain_topology, "kernel-log": explain_xid, "nccl-log": explain_nccl_log}


def explain(path: Path, settings: Settings, profile_named: bool) -> Explained:
    """The capture at ``path`` explained; judged against a profile only where one is named
    (a saved file comes from another machine: this one's `auto` says nothing about it).
    Raises UsageError for a file that cannot be read, is binary, or is of no known kind."""
    text = capture.read_text(path, MAX_BYTES, "pass an excerpt: the part of the log or output in question", option=None)
    if not text.strip():
        raise UsageError(f"{path}: is empty; save the output to explain into it ({kinds.KNOWN})")
    kind = kinds.guess(text)
    if kind is None:
        raise UsageError(f"{path}: not a capture preflight knows; it reads {kinds.KNOWN}")
    # `auto` picks this machine's profile, which says nothing of a file from another: the capture's own GPU model decides.
    profile = pipeline.resolve_profile(settings) if profile_named and settings.profile != "auto" else None
    return EXPLAINERS[kind].explain(text, str(path), profile)
