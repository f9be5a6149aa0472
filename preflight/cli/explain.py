"""The explainers: `preflight list`, `show-profile`, `detect`, `explain`, `xid`,
`topology` and `nccl-log`. Each reads (this node, or a saved file), judges, and prints."""

# No `from __future__ import annotations`: see preflight/cli/common.py.
import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from preflight.base.errors import UsageError
from preflight.cli import plain
from preflight.cli.common import PROFILE_HELP, ConfigOpt, FakeOpt, JsonOpt, ProfileOpt, _console, _emit, _exit_codes, _settings


@_exit_codes
def list_checks(profile: ProfileOpt = None, config: ConfigOpt = None, json_out: JsonOpt = False) -> int:
    """The installed checks, cheapest first, with what each verifies."""
    from preflight.outputs import profile_text
    from preflight.pipeline import plan as pipeline, registry

    settings = _settings(config, profile=profile)  # a bad config is refused here too
    order = pipeline.resolve_profile(settings).checks if profile is not None else None  # the profile's checks, in its order
    rows = profile_text.check_rows(registry.installed(order))
    if json_out:
        print(json.dumps(rows, indent=2))
        return 0
    print(profile_text.check_table(rows), end="")
    return 0


@_exit_codes
def show_profile(
    name: Annotated[Optional[str], typer.Argument(metavar="NAME", help=f"Profile: {PROFILE_HELP} [default: the configured one, else auto]")] = None,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
) -> int:
    """The resolved profile: checks, expected GPUs, and every floor with where its value came from."""
    from preflight.pipeline import plan as pipeline, profile_detect, profiles
    from preflight.outputs import profile_text

    s = _settings(config, profile=name)
    try:
        p = pipeline.resolve_profile(s)
    except profile_detect.NvmlUnreadable as e:
        if name is not None:  # `show-profile auto` asked for detection: its failure is the answer
            raise
        # Nothing asked for detection: the person wants to read a profile, and this names them.
        known = ", ".join(sorted(profiles.available(s.profiles_dir)))
        raise UsageError(f"no profile named, and `auto` has no GPU to pick by here ({e.cause}); "
                         f"name one: preflight show-profile NAME, with NAME one of {known}") from None
    if json_out:
        print(p.model_dump_json(indent=2))
        return 0
    print(profile_text.describe(p), end="")
    return 0


@_exit_codes
def detect(config: ConfigOpt = None, json_out: JsonOpt = False, nvml_fake: FakeOpt = None) -> int:
    """What NVML sees on this node, its shape (how many GPUs, how joined, which NICs), and which profile `auto` picks, and why.

    With --json the answer is always a JSON document, with `error` (and, where known, `cause` and `fix`)
    set when it exits non-zero. Exit 1 when there is no driver or `auto` picks no profile, 2 on bad input."""
    from preflight.base.host import Host
    from preflight.outputs import detect_text
    from preflight.pipeline import plan as pipeline, profile_detect, shape
    from preflight.readers.nvidia import nvml

    def failed(error: str, cause: Optional[str] = None, fix: Optional[str] = None) -> None:
        if json_out:
            _emit(detect_text.unread_json(f"fake {nvml_fake}" if nvml_fake else "NVML", error, cause, fix))

    try:
        s = _settings(config, nvml_fake=nvml_fake)
        pipeline.check_inputs(s)
        inventory = nvml.inventory(s.nvml_fake)
        try:
            (name, why), no_pick = profile_detect.choose(inventory, s.profiles_dir), None
        except profile_detect.DetectionFailed as e:
            name, why, no_pick = None, f"{e.cause}; {e.remedy}", e
        node = shape.gather(Host(), inventory, s.node_gpus)
    except UsageError as e:
        failed(str(e))
        raise
    except nvml.NvmlUnavailable as e:
        failed(f"{e.cause}; {e.remedy}", e.cause, e.remedy)
        raise profile_detect.DetectionFailed(e.cause, e.remedy) from None
    if json_out:
        _emit(detect_text.to_json(inventory, name, why, node, no_pick))
    else:
        print(detect_text.describe(inventory, name, why, node), end="")
    return 0 if name else 1


@_exit_codes
def xid(
    from_file: Annotated[Optional[Path], typer.Option("--from", metavar="FILE", help="A saved kernel log (dmesg, journalctl, syslog, /dev/kmsg records) instead of this machine's.")] = None,
    json_out: JsonOpt = False,
) -> int:
    """Explain the NVIDIA Xid/SXid errors in this machine's kernel log since boot, or in a saved log.

    Exit 1 when a fatal event is listed, so scripts can act on it; 2 when --from FILE holds no kernel log lines."""
    from preflight.base.host import Host
    from preflight.outputs.explain import xid_text
    from preflight.readers.kernel import log_sources, xid as xids

    if from_file is not None:
        text, source = xids.read_file(from_file), str(from_file)
    else:
        try:
            log = log_sources.read_log(Host(), timeout=10.0)
            text, source = log.text, log.source + (f" ({log.note})" if log.note else "")
        except log_sources.KernelLogUnavailable as e:  # this machine's doing, not bad input: exit 1
            _console().error(f"cannot read the kernel log: {e}; run as root, or save `dmesg` to a file and use --from FILE")
            return 1
    rows = xid_text.rows(xids.parse(text))
    if json_out:
        _emit(xid_text.to_json(rows, source))
    else:
        print(xid_text.describe(rows, source), end="")
    return 1 if xid_text.fatal(rows) else 0


@_exit_codes
def topology(
    from_file: Annotated[Optional[Path], typer.Option("--from", metavar="FILE", help="A saved `nvidia-smi topo -m` output (from any machine) instead of this one's.")] = None,
    profile: Annotated[Optional[str], typer.Option("--profile", "-p", metavar="NAME", help=f"Judge against this profile: {PROFILE_HELP} [default: auto on this machine; none with --from]")] = None,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    nvml_fake: FakeOpt = None,
) -> int:
    """How GPUs, NICs and CPUs are laid out, what is wrong with it, and how to pin each rank.

    Exit 1 when a finding fails the profile, or this machine's layout cannot be read."""
    from preflight.outputs.explain import topology_text

    s = _settings(config, profile=profile, nvml_fake=nvml_fake)
    try:
        if from_file is not None:
            text, data, failed = topology_text.explain_capture(from_file, s, profile_named=profile is not None)
        else:
            text, data, failed = topology_text.explain_host(s, note=_console().note)
    except topology_text.Unreadable as e:
        if e.shown:  # the CPUs, NUMA nodes and NICs, read all the same
            _emit(json.dumps(e.shown[1], indent=2) + "\n" if json_out else e.shown[0])
        _console().error(plain.one_line(str(e)))
        return 1
    _emit(json.dumps(data, indent=2) + "\n" if json_out else text)
    return 1 if failed else 0


@_exit_codes
def nccl_log(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="A saved NCCL_DEBUG=INFO log, or a PyTorch/NCCL error log.", show_default=False)],
    json_out: JsonOpt = False,
) -> int:
    """Explain an NCCL log: version, network, transport per rank pair, NCCL's warnings, known errors and their fix.

    Exit 1 when the log shows a known NCCL failure (a warning, such as a CollNet fallback, exits 0),
    2 when the file holds no NCCL output."""
    from preflight.outputs.explain import nccl_log_text
    from preflight.outputs.explain.explain_nccl_log import NO_NCCL
    from preflight.readers import capture
    from preflight.readers.nccl import nccl_log as nccl

    text = capture.read_text(file, nccl.MAX_BYTES, "pass one rank's log, or an excerpt (grep -e NCCL -e Watchdog)", option=None)
    log = nccl.parse(text)
    if not log.nccl_lines and not log.problems:  # the wrong file: a gate must not read that as a clean run
        raise UsageError(f"{file} {NO_NCCL}")
    _emit(json.dumps(nccl_log_text.to_json(log, str(file)), indent=2) + "\n" if json_out else nccl_log_text.render(log, str(file)))
    return 1 if any(p.severity == "fail" for p in log.problems) else 0


@_exit_codes
def explain(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="A saved capture: nvidia-smi -q, dcgmi diag, nccl-tests output, a kernel log, df, nvidia-smi topo -m, an NCCL log.", show_default=False)],
    profile: Annotated[Optional[str], typer.Option("--profile", "-p", metavar="NAME", help=f"Judge against this profile: {PROFILE_HELP} [default: the GPU model the capture names, where it names one]")] = None,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
) -> int:
    """Say what a saved capture is, and what is wrong in it: each finding with its cause and fix.

    Exit 1 when a finding fails, 2 when the file is of no kind preflight knows."""
    from preflight.outputs.explain import explain_file, explained

    s = _settings(config, profile=profile)
    found = explain_file.explain(file, s, profile_named=profile is not None)
    _emit(json.dumps(found.to_json(), indent=2) + "\n" if json_out else explained.render(found))
    return 1 if found.failed else 0
