"""What the checks in checks/ are built from, shared between them.

figures (one judged number and its floor or ceiling), confirm (a second
reading before a FAIL), placement (per-rank pinning advice, and the GPU pairs
the topology check found linked).

Imports: preflight.base, preflight.readers, preflight.pipeline and
preflight.gpuwork; never a check, an output or the CLI.
"""
