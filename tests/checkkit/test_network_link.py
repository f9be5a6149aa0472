"""The inter-node bus-bandwidth floors fitted to the network (preflight/checkkit/network_link.py),
on recorded facts: the rdma check's result as it reads the compute ports, the h100-sxm profile."""

from __future__ import annotations

import pytest

from preflight.base.findings import Measurement, Status
from preflight.checkkit import network_link
from preflight.checkkit.bandwidth_figures import BPS, Figure
from preflight.checks.bandwidth import judge_floors
from preflight.pipeline import profiles
from preflight.pipeline.check import Result

FAIL = Status.FAIL
GB = 1e9


# ---- inter-node floors on a fabric cabled below the reference design -------------------------


def _rdma(rate_gbps: float, below: bool, ports: int = 8) -> Result:
    """The rdma check's result as it reads 8 compute ports at ``rate_gbps`` (its measurements give
    a floor to the compute ports it holds; details.rate says where they run below the reference)."""
    ms = [Measurement(name="rdma_port_rate", unit="gbit_per_second", value=rate_gbps, labels={"device": f"mlx5_{i}", "port": "1"}, floor=rate_gbps)
          for i in range(ports)]
    ms.append(Measurement(name="rdma_port_rate", unit="gbit_per_second", value=25.0, labels={"device": "mlx5_8", "port": "1"}))  # storage: no floor
    said = f"compute ports at {rate_gbps:g} Gb/sec (2X NDR), below the reference design's 400 Gb/sec: the site's fabric" if below else None
    return Result(check="rdma", status=Status.PASS, summary="8 compute ports", measurements=ms, details={"rate": {"below_reference": said}})


def test_a_healthy_ndr200_node_is_held_to_its_own_nics_across_nodes_not_to_ndr400s():
    """2 x 8 H100 SXM on an NDR200 fabric (the profile's [rdma] and the rdma check: the site's design,
    not a fault): its inter-node all_reduce busbw reads about 8 x 24 GB/s, as DGX A100's 8 HDR 200 Gb/s
    ports do (192 GB/s, NVIDIA/nccl#812). The profile's 331.2 GB/s floor is 0.9 x 8 NDR 400 NICs:
    held to it, the node FAILs; held to its own ports' rate (x0.50), it passes."""
    path = profiles.find("h100-sxm", None)
    prof = profiles.resolve(profiles.load(path), path, {}, "test")
    name = "internode_allreduce_bus_bandwidth"
    fig = [Figure(name=name, unit=BPS, value=185 * GB, where="16 ranks on 2 nodes", labels={"collective": "all_reduce"})]
    assert judge_floors(fig, prof.floors, 0.05)[0].status == FAIL  # the floor as the profile states it
    fitted, said = network_link.fit(dict(prof.floors), _rdma(200, below=True), prof.rdma.reference_rate_gbps)
    assert fitted[name].value == pytest.approx(165.6e9) and judge_floors(fig, fitted, 0.05) == []
    assert said == "this node's compute ports run at 200 Gb/s, the reference design's at 400 (the rdma check: the site's fabric): inter-node all_reduce bus bandwidth floor x0.50"
    assert said in fitted[name].source and fitted["h2d_bandwidth"] == prof.floors["h2d_bandwidth"]  # only the NICs' floors
    # Still a floor: the same node at half its NICs' pace fails.
    assert judge_floors([fig[0].model_copy(update={"value": 96 * GB})], fitted, 0.05)[0].status == FAIL


def test_inter_node_floors_stand_at_the_reference_rate_without_the_rdma_check_or_for_a_sites_own_floor():
    path = profiles.find("h100-sxm", None)
    prof = profiles.resolve(profiles.load(path), path, {}, "test")
    floors = dict(prof.floors)
    assert network_link.fit(floors, _rdma(400, below=False), 400) == (floors, None)  # NDR 400: the reference design
    assert network_link.fit(floors, None, 400) == (floors, None)  # rdma did not run: nothing says the fabric is slower
    site = {**floors, "internode_allreduce_bus_bandwidth": floors["internode_allreduce_bus_bandwidth"].model_copy(update={"origin": "config /etc/preflight/config.toml line 3"})}
    assert network_link.fit(site, _rdma(200, below=True), 400) == (site, None)  # the site's own number for its fabric
