"""Work in child processes, and never hanging on it.

launch (a worker script under torchrun, in its own session, with a deadline
and a kill of its whole process group; + launch_output, what it leaves behind,
and processes, the ones it marked), ranks (one worker run, from launch to
facts; + ranks_judge, those facts in findings), cuda_init (the cuda check's worker run and its report), multinode
(which group this node belongs to), meeting (a node's side of its group's
meetings), pairwise (`preflight pairwise`: nodes two at a time), selftest
(+ selftest_report: `preflight selftest`, the GPU acceptance kit, which runs
preflight itself as children).

Imports: preflight.base, preflight.readers, one another and the package's
__version__; never the
pipeline, a check, an output or the CLI.
"""
