"""Block topology on a real local cluster: two pools in two blocks, as slurmctld shows them,
and jobs asking for `--segment` placed within one block; blocks from the Kubernetes Nodes'
labels where the syncer finds them; and `tree`, the default."""

from __future__ import annotations

from collections.abc import Iterator

import hostlist
import pytest

from ..support.cluster import LocalCluster, running, wait_for

CONTROLLER = "slonk-controller-0"
BLOCKS = {"b1": ["slonk-a-0", "slonk-a-1"], "b2": ["slonk-b-0", "slonk-b-1"]}
POOL = {"replicas": 2, "cpus": 2, "memoryMiB": 512}
LABEL = "node-restriction.kubernetes.io/nvlink-domain"
VALUES = {
    "slurm": {"topology": "block"},
    "syncer": {"topologyLabels": {"block": LABEL}},
    "nodepools": {
        "cpu": None,
        "a": {**POOL, "topology": {"block": "b1"}},
        "b": {**POOL, "topology": {"block": "b2"}},
    },
    "partitions": {"main": {"pools": ["a", "b"]}},
}
NODES = tuple(node for nodes in BLOCKS.values() for node in nodes)


@pytest.fixture(scope="module")
def blocks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state_dir = tmp_path_factory.mktemp("topology") / "state"
    with running(state_dir, values=VALUES):
        cluster = LocalCluster(state_dir)
        cluster.wait_idle(NODES)
        yield cluster


def _fields(line: str) -> dict[str, str]:
    return dict(field.split("=", 1) for field in line.split() if "=" in field)


def _blocks(cluster: LocalCluster) -> dict[str, list[str]]:
    out = cluster.pod(CONTROLLER).check_output("scontrol show topology")
    return {
        f["BlockName"]: hostlist.expand_hostlist(f["Nodes"])
        for f in map(_fields, out.splitlines())
        if "BlockName" in f
    }


def test_slurmctld_shows_both_blocks(blocks: LocalCluster) -> None:
    assert _blocks(blocks) == BLOCKS


def _node_list(cluster: LocalCluster, job: str) -> list[str]:
    out = cluster.pod(CONTROLLER).check_output(f"squeue --noheader --jobs={job} --format='%T|%N'")
    state, nodes = out.strip().split("|")
    return hostlist.expand_hostlist(nodes) if state == "RUNNING" else []


def test_a_job_asking_for_a_segment_lands_within_one_block(blocks: LocalCluster) -> None:
    """Two whole-node jobs of one 2-node segment each: each gets one block, all of it."""
    jobs = [
        blocks.submit(
            "--nodes=2", "--segment=2", "--exclusive", "--output=/dev/null", "--wrap", "sleep 600"
        )
        for _ in range(2)
    ]
    try:
        placed = {
            job: wait_for(f"job {job} running", lambda job=job: _node_list(blocks, job))
            for job in jobs
        }
        assert sorted(sorted(nodes) for nodes in placed.values()) == sorted(BLOCKS.values())
    finally:
        blocks.pod(CONTROLLER).run(f"scancel {' '.join(jobs)}")


def test_a_segment_larger_than_a_block_is_refused(blocks: LocalCluster) -> None:
    out = blocks.user().run("sbatch --nodes=4 --segment=4 --wrap true")
    assert out.rc != 0
    assert "Requested topology configuration is not available" in out.stderr


def test_tree_topology_is_shown_too(healthy: LocalCluster) -> None:
    """The default (`tree`): one pool is one leaf switch."""
    out = healthy.pod(CONTROLLER).check_output("scontrol show topology")
    (leaf,) = [f for f in map(_fields, out.splitlines()) if "SwitchName" in f]
    assert (leaf["SwitchName"], hostlist.expand_hostlist(leaf["Nodes"])) == (
        "cpu",
        ["slonk-cpu-0", "slonk-cpu-1"],
    ), out


def test_blocks_follow_the_nodes_labels(blocks: LocalCluster) -> None:
    """Labelled across the pools, the nodes form the labels' blocks; relabelled, Slurm
    follows; unlabelled, each pool's own block is back."""
    across = {"nvl1": ["slonk-a-0", "slonk-b-0"], "nvl2": ["slonk-a-1", "slonk-b-1"]}
    try:
        for block, nodes in across.items():
            for node in nodes:
                blocks.kubectl("label", "--overwrite", "node", f"local-{node}", f"{LABEL}={block}")
        wait_for("blocks from the labels", lambda: _blocks(blocks) == across)
        blocks.kubectl("label", "--overwrite", "node", "local-slonk-b-1", f"{LABEL}=nvl1")
        moved = {"nvl1": ["slonk-a-0", "slonk-b-0", "slonk-b-1"], "nvl2": ["slonk-a-1"]}
        wait_for("slonk-b-1 in nvl1", lambda: _blocks(blocks) == moved)
    finally:
        for node in NODES:
            blocks.kubectl("label", "node", f"local-{node}", f"{LABEL}-")
    wait_for("the pools' own blocks back", lambda: _blocks(blocks) == BLOCKS)
