import json

import pytest
from conftest import FIXTURES

from preflight.pipeline import profiles
from preflight.base.errors import UsageError
from preflight.pipeline.profiles import SiteFloor


def test_builtin_cpu_profile_loads_and_cites_every_floor():
    p = profiles.load(profiles.find("cpu", None))
    assert not p.has_gpus and p.checks[0] == "shm"
    assert p.floors["shm_min_bytes"].value == 2**30
    assert all(f.source.strip() for f in p.floors.values())


def test_every_builtin_profile_is_valid_and_cited():
    for name, path in profiles.available(None).items():
        p = profiles.load(path)
        assert p.name == name
        assert all(f.source.strip() for f in p.floors.values()), name


def test_unknown_profile_names_the_choices():
    with pytest.raises(UsageError, match=r"unknown profile 'h900'; choose one of: auto, a100-pcie, a100-sxm4-80gb, cpu, gb10, generic, h100-nvl, h100-pcie, h100-sxm, h200-sxm"):
        profiles.find("h900", None)


def test_site_profile_overrides_a_builtin_of_the_same_name(tmp_path):
    (tmp_path / "cpu.toml").write_text("")
    assert profiles.available(tmp_path)["cpu"] == tmp_path / "cpu.toml"


@pytest.mark.parametrize(
    "text, message",
    [
        ('name = "x"\ndescription = "d"\nchecks = ["shm"]\ncolor = "red"\n', r"x.toml line 4: color: unknown key"),
        ('name = "x"\ndescription = "d"\ngpu_count = 8\nchecks = ["shm"]\n', r"line 3: gpu_count: unknown key"),
        (
            'name = "x"\ndescription = "d"\nchecks = ["shm"]\n\n[floors.shm_min_bytes]\nvalue = -5\nunit = "bytes"\nsource = "s"\n',
            r"line 6: floors.shm_min_bytes.value: Value error, a floor must be a finite number >= 0, not -5",
        ),
        (
            'name = "x"\ndescription = "d"\nchecks = ["shm"]\n\n[floors.shm_min_bytes]\nvalue = "1073741824"\nunit = "bytes"\nsource = "s"\n',
            r"line 6: floors.shm_min_bytes.value: Value error, a floor must be a number, not str",
        ),
        (
            'name = "x"\ndescription = "d"\nchecks = ["shm"]\n\n[floors.shm_min_bytes]\nvalue = inf\nunit = "bytes"\nsource = "s"\n',
            r"line 6: floors.shm_min_bytes.value: Value error, a floor must be a finite number",
        ),
        (
            'name = "x"\ndescription = "d"\nchecks = ["shm"]\n\n[floors.shm_min_bytes]\nvalue = 1' + "0" * 400 + '\nunit = "bytes"\nsource = "s"\n',
            r"line 6: floors.shm_min_bytes.value: Value error, a floor must be a finite number >= 0, not an integer of 401 digits",
        ),
        ('name = "x"\ndescription = "d"\nchecks = ["shm"]\n[timeouts]\nshm = inf\n', r"line 5: timeouts.shm: Input should be a finite number"),
        ('name = "x"\ndescription = "d"\nchecks = ["shm"]\n[timeouts]\nshm = 1e12\n', r"line 5: timeouts.shm: Input should be less than or equal to 86400"),
        (
            'name = "x"\ndescription = "d"\nchecks = ["shm"]\n\n[floors.shm_min_bytes]\nvalue = 5\nunit = "bytes"\n',
            r"line 5: floors.shm_min_bytes.source: required key is missing",
        ),
        ('name = "x"\ndescription = "d"\nchecks = ["shm", "shm"]\n', r"line 3: checks: Value error, lists shm more than once"),
        ('name = "y"\ndescription = "d"\nchecks = ["shm"]\n', r"name 'y' must match the file name 'x'"),
        ('name = "x\n', r"invalid TOML: .*line 1"),
        ('name = "x"\ndescription = "d"\nchecks = ["shm"]\n[timeouts]\nshn = 5\n', r"\[timeouts\] names shn, not in checks \(shm\)"),
    ],
)
def test_bad_profile_files_name_file_line_and_key(tmp_path, text, message):
    path = tmp_path / "x.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        profiles.load(path)



@pytest.mark.parametrize("old, new, message", [
    ("seconds = 1\n", "seconds = true\n", r"line 14: levels.quick.seconds: Input should be a valid number"),
    ("ranks = 2\n", "ranks = true\n", r"nccl.ranks: Input should be a valid integer"),
    ("seconds = 12\n", 'seconds = "12"\n', r"line 20: levels.standard.seconds: Input should be a valid number"),
])
def test_a_profile_s_numbers_must_be_toml_numbers(tmp_path, old, new, message):
    # Before: `seconds = true` read as 1 second and `ranks = true` as one rank, `seconds = "12"` as 12.
    text = (profiles.BUILTIN_DIR / "cpu.toml").read_text()
    assert text.count(old) >= 1
    path = tmp_path / "cpu.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(UsageError, match=message):
        profiles.load(path)

def test_a_whole_number_written_as_a_float_still_loads_where_a_count_is_wanted(tmp_path):
    # Lax validation took `copy_bytes = 1.073741824e9` (a site profile's way of writing 1 GiB); strict
    # validation alone refused it and, at the boot gate, would have blocked a node on its upgrade.
    text = (profiles.BUILTIN_DIR / "a100-pcie.toml").read_text()
    path = tmp_path / "a100-pcie.toml"
    path.write_text(text.replace("copy_bytes = 1073741824", "copy_bytes = 1.073741824e9", 1))
    assert "1.073741824e9" in path.read_text()
    assert profiles.load(path).bandwidth.copy_bytes == 1073741824
    path.write_text(text.replace("copy_bytes = 1073741824", "copy_bytes = 1.5", 1))
    with pytest.raises(UsageError, match="copy_bytes"):
        profiles.load(path)  # a fraction is no count


def test_site_overrides_replace_values_and_record_their_origin():
    path = profiles.find("cpu", None)
    r = profiles.resolve(profiles.load(path), path, {"shm_min_bytes": SiteFloor(2.0**31, "config /etc/x.toml line 3")}, "--profile cpu")
    assert r.floors["shm_min_bytes"].value == 2**31
    assert r.floors["shm_min_bytes"].origin == "config /etc/x.toml line 3"
    assert r.floors["shm_min_bytes"].source.startswith("NGC")


def test_an_override_of_a_floor_the_profile_lacks_is_refused():
    path = profiles.find("cpu", None)
    with pytest.raises(UsageError, match=r"config /etc/x.toml line 9: floor 'hbm_copy' is not a floor of profile cpu"):
        profiles.resolve(profiles.load(path), path, {"hbm_copy": SiteFloor(1.0, "config /etc/x.toml line 9")}, "x")


def test_a_site_floor_table_with_a_unit_adds_a_floor_the_profile_lacks():
    path = profiles.find("cpu", None)
    site = {"allgather_bus_bandwidth": SiteFloor(3e8, "config /etc/f.toml line 4", "bytes_per_second", "preflight calibrate on node1")}
    r = profiles.resolve(profiles.load(path), path, site, "x")
    f = r.floors["allgather_bus_bandwidth"]
    assert (f.value, f.unit, f.bound, f.source, f.origin) == (3e8, "bytes_per_second", "min", "preflight calibrate on node1", "config /etc/f.toml line 4")


def test_a_site_floor_in_another_unit_than_the_profile_s_is_refused():
    path = profiles.find("cpu", None)
    with pytest.raises(UsageError, match=r"line 2: floor 'memcpy_bandwidth' is in 'GB/s', but profile cpu measures it in 'bytes_per_second'; convert"):
        profiles.resolve(profiles.load(path), path, {"memcpy_bandwidth": SiteFloor(2.0, "config /etc/f.toml line 2", "GB/s")}, "x")
    with pytest.raises(UsageError, match=r"floor 'allreduce_latency' has bound 'min', but profile cpu's is 'max'"):
        profiles.resolve(profiles.load(path), path, {"allreduce_latency": SiteFloor(1.0, "config /etc/f.toml line 2", "seconds", None, "min")}, "x")


def test_a_site_floor_keeps_the_profile_s_source_unless_it_gives_one():
    path = profiles.find("cpu", None)
    r = profiles.resolve(profiles.load(path), path, {"memcpy_bandwidth": SiteFloor(3e9, "config /etc/f.toml line 2", "bytes_per_second")}, "x")
    assert r.floors["memcpy_bandwidth"].value == 3e9 and "DDR4" in r.floors["memcpy_bandwidth"].source


BW = 'name = "x"\ndescription = "d"\nchecks = ["bandwidth"]\n'


@pytest.mark.parametrize(
    "gpus, table, message",
    [
        (0, "", r"checks lists bandwidth but the \[bandwidth\] table is missing"),
        (0, '[bandwidth]\nsizes_source = "s"\n', r"\[bandwidth\] ranks is needed on a profile without a \[gpu\] table"),
        (0, '[bandwidth]\nranks = 2\nrepeats = 3\nsizes_source = "s"\n', r"bandwidth.repeats: Input should be greater than or equal to 5"),
        (0, '[bandwidth]\nranks = 2\nlatency_iters = 50\nsizes_source = "s"\n', r"bandwidth.latency_iters: Input should be greater than or equal to 100"),
        (0, '[bandwidth]\nranks = 2\nsmall_bytes = 1048576\ncollective_bytes = 1048576\nsizes_source = "s"\n', r"small_bytes must be below collective_bytes"),
        (0, '[bandwidth]\nranks = 2\nmargin = 0.9\nsizes_source = "s"\n', r"bandwidth.margin: Input should be less than or equal to 0.5"),
        (0, '[bandwidth]\nranks = 2\n', r"bandwidth.sizes_source: required key is missing"),
        (0, '[bandwidth]\nranks = 2\ntolerance = 0.05\nsizes_source = "s"\n', r"tolerance set without converge_source: say where the tolerance and caps came from"),
        (0, '[bandwidth]\nranks = 2\ntolerance = 0\nconverge_source = "c"\nsizes_source = "s"\n', r"bandwidth.tolerance: Input should be greater than 0"),
        (0, '[bandwidth]\nranks = 2\nrepeats = 40\nsizes_source = "s"\n', r"max_repeats \(30\) must not be below repeats \(40\): repeats always runs"),
        (0, '[bandwidth]\nranks = 2\nmax_latency_iters = 150\nconverge_source = "c"\nsizes_source = "s"\n', r"max_latency_iters \(150\) must not be below latency_iters \(200\)"),
    ],
)
def test_a_bad_bandwidth_table_names_what_is_wrong(tmp_path, gpus, table, message):
    path = tmp_path / "x.toml"
    path.write_text(BW.replace("GPUS", str(gpus)) + table)
    with pytest.raises(UsageError, match=message):
        profiles.load(path)


def test_an_hbm_copy_under_1_gib_on_a_gpu_profile_is_refused(tmp_path):
    text = profiles.find("h100-sxm", None).read_text().replace("copy_bytes = 1073741824", "copy_bytes = 67108864")
    path = tmp_path / "h100-sxm.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match="copy_bytes 67108864 is under 1 GiB: an HBM copy that small runs partly in L2"):
        profiles.load(path)


def test_every_gpu_profile_with_bandwidth_cites_its_sizes_and_floors():
    for name, path in profiles.available(None).items():
        p = profiles.load(path)
        if "bandwidth" not in p.checks:
            continue
        assert p.bandwidth and p.bandwidth.sizes_source.strip(), name
        if p.gpu and not p.gpu.model_floors:  # generic: no model, no floor of one; its figures are held to the node's own GPUs
            assert not any(f.endswith(("_bandwidth", "_latency", "_throughput")) for f in p.floors) and p.outliers, name
            continue
        needed = ("hbm_copy_bandwidth", "h2d_bandwidth", "d2h_bandwidth") if p.has_gpus else ("memcpy_bandwidth",)
        assert all(f in p.floors and p.floors[f].unit == "bytes_per_second" for f in needed), name
        assert all(p.floors[f].bound == "max" and p.floors[f].unit == "seconds" for f in p.floors if "latency" in f), name


def test_every_gpu_profile_cites_its_expectations():
    for name, path in profiles.available(None).items():
        p = profiles.load(path)
        if p.has_gpus:
            assert p.gpu and p.gpu.driver_source and p.checks[0] == "cuda", name
            assert all(f.source for f in p.floors.values()), name


def test_no_builtin_profile_holds_rdma_ports_to_a_rate_only_to_its_reference_design():
    """How fast the fabric runs is the site's choice (an HGX H100 on NDR200 is healthy): a built-in
    profile's rate is the reference design's, cited and never a floor; a site profile sets rate_gbps."""
    for name, path in profiles.available(None).items():
        rdma = profiles.load(path).rdma
        assert rdma is None or rdma.rate_gbps is None, name
    designs = {name: profiles.load(profiles.find(name, None)).rdma for name in ("h100-sxm", "h200-sxm", "a100-sxm4-80gb")}
    assert {name: r.reference_rate_gbps for name, r in designs.items() if r} == {"h100-sxm": 400, "h200-sxm": 400, "a100-sxm4-80gb": 200}
    assert all(r and r.reference_rate_source and r.reference_rate_source.startswith("DGX ") for r in designs.values())


@pytest.mark.parametrize("table, message", [
    ('[rdma]\ninterval_source = "s"\nreference_rate_gbps = 400\n', r"reference_rate_gbps needs reference_rate_source"),
    ('[rdma]\ninterval_source = "s"\nrate_gbps = 200\n', r"rate_gbps needs rate_source"),
])
def test_an_rdma_rate_without_its_source_is_refused(tmp_path, table, message):
    path = tmp_path / "x.toml"
    path.write_text('name = "x"\ndescription = "d"\nchecks = ["shm"]\n\n' + table)
    with pytest.raises(UsageError, match=message):
        profiles.load(path)


TRAIN = 'name = "x"\ndescription = "d"\nchecks = ["train"]\n'


@pytest.mark.parametrize(
    "gpus, table, message",
    [
        (0, "", r"checks lists train but the \[train\] table is missing"),
        (0, '[train]\nstraggler_source = "s"\nsizes_source = "s"\n', r"\[train\] ranks is needed on a profile without a \[gpu\] table"),
        (0, '[train]\nranks = 2\nd_model = 100\nheads = 16\nstraggler_source = "s"\nsizes_source = "s"\n', r"d_model 100 must be a multiple of heads 16"),
        (0, '[train]\nranks = 2\nstraggler_max = 1.0\nstraggler_source = "s"\nsizes_source = "s"\n', r"train.straggler_max: Input should be greater than 1"),
        (0, '[train]\nranks = 2\nsteps = 2\nstraggler_source = "s"\nsizes_source = "s"\n', r"train.steps: Input should be greater than or equal to 3"),
        (0, '[train]\nranks = 2\npeak_flops = 1e15\nstraggler_source = "s"\nsizes_source = "s"\n', r"peak_flops needs peak_source"),
        (0, '[train]\nranks = 2\nsizes_source = "s"\n', r"train.straggler_source: required key is missing"),
    ],
)
def test_a_bad_train_table_names_what_is_wrong(tmp_path, gpus, table, message):
    path = tmp_path / "x.toml"
    path.write_text(TRAIN.replace("GPUS", str(gpus)) + table)
    with pytest.raises(UsageError, match=message):
        profiles.load(path)


def test_every_profile_with_train_cites_its_gemm_floor_and_peak():
    for name, path in profiles.available(None).items():
        p = profiles.load(path)
        if "train" not in p.checks:
            continue
        assert p.train and p.train.straggler_source.strip() and p.train.sizes_source.strip(), name
        if p.has_gpus:
            assert p.floors["gemm_throughput"].unit == "flops_per_second" and "MAMF" in p.floors["gemm_throughput"].source, name
            assert p.train.peak_flops and p.floors["gemm_throughput"].value < p.train.peak_flops, name


# Measured by this project with the bandwidth worker's method (torch copy_
# between two device buffers, read + write counted), issue 18.
HBM_COPY_MEASURED = {"h100-sxm": 3.0e12, "h200-sxm": 4.3e12}
# How far below that figure the warn band must end: board-to-board spread and
# a figure given as "about" must never put a healthy board in the band.
HBM_COPY_CLEARANCE = 0.20


@pytest.mark.parametrize("name", sorted(HBM_COPY_MEASURED))
def test_hbm_copy_floor_comes_from_the_worker_s_method_and_clears_a_healthy_board(name):
    p = profiles.load(profiles.find(name, None))
    floor, measured = p.floors["hbm_copy_bandwidth"], HBM_COPY_MEASURED[name]
    warn_band_top = floor.value * (1 + p.bandwidth.margin)
    assert warn_band_top * (1 + HBM_COPY_CLEARANCE) <= measured
    assert "bandwidth worker's method" in floor.source and "issue 18" in floor.source


def h200_gemm_measured() -> float:
    """The train check's GEMM on the healthy H200 (tests/fixtures/node/h200-1x-vm), as recorded."""
    report = json.loads((FIXTURES / "node" / "h200-1x-vm" / "report-standard-keep-going.json").read_text())
    train = next(c for c in report["checks"] if c["check"] == "train")
    return next(m["value"] for m in train["measurements"] if m["name"] == "gemm_throughput")


# The MAMF table's best-shape figure each GEMM floor rests on (ml-engineering), and the H200's own.
GEMM_MAMF = {"h100-sxm": 792.1e12, "h200-sxm": 792.1e12, "a100-pcie": 256.4e12, "a100-sxm4-80gb": 267.9e12}


def test_the_h200_gemm_floor_stays_below_0_8x_the_healthy_figure_its_method_read():
    measured = h200_gemm_measured()
    assert measured == pytest.approx(673.9e12, rel=1e-3)
    floor = profiles.load(profiles.find("h200-sxm", None)).floors["gemm_throughput"]
    assert floor.value <= 0.8 * measured
    assert "673.9 TFLOP/s" in floor.source and "h200-1x-vm" in floor.source


@pytest.mark.parametrize("name", sorted(GEMM_MAMF))
def test_every_mamf_gemm_floor_leaves_the_h200_s_margin_under_what_the_method_reads(name):
    # The method read 0.85 of MAMF on the healthy H200; a floor at 0.8 of MAMF sat 6% under it.
    reads = h200_gemm_measured() / GEMM_MAMF["h200-sxm"]
    floor = profiles.load(profiles.find(name, None)).floors["gemm_throughput"]
    assert f"{GEMM_MAMF[name] / 1e12:.1f} TFLOP/s MAMF" in floor.source
    assert floor.value <= 0.8 * reads * GEMM_MAMF[name]


def test_every_profile_that_measures_cites_where_its_tolerance_and_caps_came_from():
    for name, path in profiles.available(None).items():
        p = profiles.load(path)
        for table in (p.bandwidth, p.train):
            if table is not None:
                assert table.converge_source and table.model_fields_set >= {"tolerance", "max_seconds"}, name


def test_a_train_cap_under_its_least_count_is_refused(tmp_path):
    text = profiles.find("cpu", None).read_text().replace("max_compute_steps = 30", "max_compute_steps = 10")
    path = tmp_path / "cpu.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=r"max_compute_steps \(10\) must not be below compute_steps \(20\): compute_steps always runs"):
        profiles.load(path)


def test_every_builtin_profile_judges_drift_with_a_cited_rule():
    for name, path in profiles.available(None).items():
        d = profiles.load(path).drift
        assert d is not None and 0 < d.fraction < 1 and d.recent + d.earlier_min <= d.recent + d.earlier and d.source.strip(), name


@pytest.mark.parametrize("table, message", [
    ("[drift]\nfraction = 0.05\n", r"drift.source: required key is missing"),
    ('[drift]\nfraction = 1.5\nsource = "s"\n', r"drift.fraction: Input should be less than 1"),
    ('[drift]\nfraction = 0.05\nearlier = 3\nsource = "s"\n', r"earlier_min 5 must be at most earlier 3"),
])
def test_a_bad_drift_table_names_what_is_wrong(tmp_path, table, message):
    path = tmp_path / "x.toml"
    path.write_text('name = "x"\ndescription = "d"\nchecks = ["shm"]\n\n' + table)
    with pytest.raises(UsageError, match=message):
        profiles.load(path)


def test_show_profile_gives_the_drift_rule_and_its_source():
    from preflight.outputs.profile_text import describe

    path = profiles.find("cpu", None)
    text = describe(profiles.resolve(profiles.load(path), path, {}, "--profile cpu"))
    assert "  drift (against the node's own history): WARN where a figure's median over the last 5 runs is more than 30% under" in text
    assert "      source: 2-core CI VM run to run (2026-11-22)" in text


@pytest.mark.parametrize("name", sorted(profiles.available(None)))
def test_every_builtin_profile_plans_every_level_it_has(tmp_path, name):
    """What `preflight run --profile NAME --level L` checks before anything runs (the floors
    each check needs, the order): a built-in profile that fails it exits 2 on every node."""
    from preflight.pipeline import plan as plan_mod
    from preflight.pipeline import settings as settings_mod

    p = profiles.load(profiles.find(name, None))
    fake = FIXTURES / "nvml" / "h100-sxm-8x-healthy.json"
    for level in ("quick", "standard", "full"):
        if getattr(p.levels, level, None) is None:
            continue
        flags = {"profile": name, "level": level, "report": tmp_path / "report.json", **({"nvml_fake": fake} if p.has_gpus else {})}
        planned = plan_mod.plan(settings_mod.load(flags, None, environ={}))
        assert [c.name for c in planned.checks] == getattr(p.levels, level).checks, (name, level)
