"""The link a ring crosses: a measured link within a node and one across nodes, each kept in its own file
beside the records, and chosen by whether the ring spans nodes (accel_kit.predict.links). The probe across
two real nodes runs on the test cluster (tests/test_cluster.py); here, the rules around it."""
from __future__ import annotations

import json

import pytest

from accel_kit import cli
from accel_kit.engine.launch import render_jobscript
from accel_kit.errors import AccelKitError
from accel_kit.predict import links
from accel_kit.predict.predictor import Predictor

from cli_checks import fail_one_line


def _keep(root, *, inter_node: bool, **fields) -> None:
    path = links.link_cache_path("cpu", root, inter_node=inter_node)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"latency_us": 10.0, "source": "measured: test"} | fields))



def test_a_ring_of_ranks_sharing_a_hosts_cores_is_kept_at_its_own_size(tmp_path):
    # A CPU's gloo ranks share its cores: 4 of them on 2 cores wait on each other far longer a ring step than 2 do,
    # so a ring of more than the probe's 2 ranks is measured, and kept, at its own size; a system with datasheet
    # figures (h200) keeps one link for every size.
    assert links.shared_host_ring("cpu", 4) and not links.shared_host_ring("cpu", 2)
    assert not links.shared_host_ring("h200", 4)
    _keep(tmp_path, inter_node=False, bandwidth_GBps=8.0)
    four = links.link_cache_path("cpu", tmp_path, ranks=4)
    assert four.name == "link-cpu-4-ranks.json"
    four.write_text(json.dumps({"bandwidth_GBps": 2.0, "latency_us": 350.0, "source": "measured: 4 ranks"}))
    assert links.system_link("cpu", 4, root=tmp_path, probe=False, own_size=True).latency_us == 350.0
    assert links.system_link("cpu", 2, root=tmp_path, probe=False, own_size=True).bandwidth_GBps == 8.0
    assert links.system_link("cpu", 3, root=tmp_path, probe=False, own_size=True).bandwidth_GBps == 8.0  # none at 3
    # asked by tune (a predictor of ranks sharing the host) only: the what-if keeps the one link for every size
    assert links.system_link("cpu", 4, root=tmp_path, probe=False).bandwidth_GBps == 8.0
    assert Predictor("cpu", [], link_root=str(tmp_path), probe=False, host_cores=2).link(4).latency_us == 350.0


def test_ranks_sharing_a_hosts_cores_compute_on_their_share():
    shared = Predictor("cpu", [], probe=False, host_cores=2)
    assert shared.host_share(4, 2)[0] == 4  # 4 ranks on 2 cores: half a core each, against the records' 2 threads
    assert shared.host_share(2, 2)[0] == 2 and shared.host_share(2, 1)[0] == 1  # one core each
    share, why = Predictor("cpu", [], probe=False, host_cores=8).host_share(3, 8)
    assert share == 4 and "3 ranks share the host's 8 cores, 2 core(s) each" in why  # 8 // 3 threads each

def test_the_inter_node_link_is_kept_apart_and_used_only_across_nodes(tmp_path):
    _keep(tmp_path, inter_node=False, bandwidth_GBps=8.0)
    _keep(tmp_path, inter_node=True, bandwidth_GBps=0.5, node_bandwidth_GBps=1.0, nodes=2, hosts=["a", "b"])
    assert links.link_cache_path("cpu", tmp_path).name == "link-cpu.json"
    assert links.link_cache_path("cpu", tmp_path, inter_node=True).name == "link-cpu-inter-node.json"
    within = links.system_link("cpu", 2, root=tmp_path, devices_per_node=2, probe=False)
    assert within.bandwidth_GBps == 8.0
    # 4 devices at 2 a node cross the nodes: each device gets its share of the node's measured bandwidth
    across = links.system_link("cpu", 4, root=tmp_path, devices_per_node=2, probe=False)
    assert across.bandwidth_GBps == pytest.approx(0.5) and "share over its 2 devices" in across.source
    one_a_node = links.system_link("cpu", 2, root=tmp_path, devices_per_node=1, probe=False)
    assert one_a_node.bandwidth_GBps == pytest.approx(1.0)
    # the system's own figure (8 a node on cpu) when the layout does not say
    assert links.system_link("cpu", 8, root=tmp_path, probe=False).bandwidth_GBps == 8.0
    assert Predictor("cpu", [], link_root=str(tmp_path), devices_per_node=1, probe=False).link(2).bandwidth_GBps \
        == pytest.approx(1.0)


def test_without_an_inter_node_link_the_error_says_how_to_measure_one(tmp_path):
    _keep(tmp_path, inter_node=False, bandwidth_GBps=8.0)  # a link within a node is no answer across nodes
    with pytest.raises(AccelKitError, match="no measured inter-node link; .*accel-kit link --system cpu --nodes 2 "
                                            "inside a batch job"):
        links.system_link("cpu", 2, root=tmp_path, devices_per_node=1, probe=False)


@pytest.mark.parametrize("argv, message", [
    (["--nodes", "2"], "the link probe over 2 nodes runs inside a batch job"),
    (["--nodes", "2", "--ranks", "3"], "3 probe ranks do not spread evenly over 2 nodes"),
    (["--nodes", "0"], "argument --nodes: must be at least 1"),
    (["--ranks", "1"], "argument --ranks: must be at least 2"),
])
def test_link_bad_requests_are_one_line(argv, message, capsys, tmp_path, monkeypatch):
    for var in ("SLURM_JOB_ID", "PBS_JOBID", "PBS_NODEFILE"):
        monkeypatch.delenv(var, raising=False)
    assert message in fail_one_line(["link", "--system", "cpu", "--output-dir", str(tmp_path), *argv], capsys)
    assert not list(tmp_path.rglob("*.json"))


def test_a_launcher_not_installed_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun here
    err = fail_one_line(["link", "--system", "cpu", "--nodes", "2", "--output-dir", str(tmp_path)], capsys)
    assert "the link probe's launcher 'srun' is not on PATH" in err


@pytest.mark.slow  # two fresh interpreters importing torch
def test_the_probe_within_a_node_keeps_its_link_and_hosts(capsys, tmp_path):
    assert cli.main(["link", "--system", "cpu", "--output-dir", str(tmp_path)]) == 0
    assert "link of cpu:" in capsys.readouterr().out
    kept = json.loads(links.link_cache_path("cpu", tmp_path).read_text())
    assert kept["ranks"] == 2 and kept["launcher"] == "local" and len(set(kept["hosts"])) == 1
    assert kept["bandwidth_GBps"] > 0 and "nodes" not in kept
    assert not links.link_cache_path("cpu", tmp_path, inter_node=True).exists()
    assert [p.name for p in (tmp_path / "what_if").iterdir()] == ["link-cpu.json"]  # the ranks' folder is gone


@pytest.mark.parametrize("launcher, ranks", [("srun", 4), ("mpiexec", 4), ("torchrun", 4)])
def test_a_job_on_several_nodes_measures_the_link_between_them_first(launcher, ranks):
    text = render_jobscript("slurm", study="scaling", system="cpu", nodes=2, devices_per_node=2, profile="smoke",
                            walltime="00:10:00", path="job.sh", launcher=launcher,
                            tasks_per_node=1 if launcher == "torchrun" else 2)
    lines = text.splitlines()
    probe = next(i for i, line in enumerate(lines) if line.startswith("accel-kit link"))
    assert lines[probe].startswith(f"accel-kit link --system cpu --nodes 2 --ranks {ranks} --launcher {launcher} ||")
    assert probe < next(i for i, line in enumerate(lines) if line.startswith("accel-kit run"))
    kwargs = dict(study="scaling", system="cpu", profile="smoke", walltime="00:10:00", path="job.sh")
    assert "accel-kit link" not in render_jobscript("slurm", nodes=2, devices_per_node=2, probe_link=False, **kwargs)
    assert "accel-kit link" not in render_jobscript("pbs", nodes=1, devices_per_node=2, **kwargs)
