"""Block topology on a real local cluster: two pools in two blocks, as slurmctld shows them,
and jobs asking for `--segment` placed within one block; blocks from the Kubernetes Nodes'
labels where the syncer finds them; and `tree`, the default."""

from __future__ import annotations

import re
import statistics
import subprocess
import time

import hostlist
import testinfra.host

from slonk.align import topology
from slonk.slurm.slurmctld import STARTED

from ..support.cluster import SLONK, LocalCluster, cluster_of_its_own, wait_for

CONTROLLER = "slonk-controller-0"
BLOCKS = {"b1": ["slonk-a-0", "slonk-a-1"], "b2": ["slonk-b-0", "slonk-b-1"]}
POOL = {"replicas": 2, "cpus": 2, "memoryMiB": 512}
LABEL = "node-restriction.kubernetes.io/nvlink-domain"
# The default window (a flap of 20 kubectl calls fits in it); a shorter interval than the
# default 30 s, so that each relabelling here waits seconds, not half a minute.
WINDOW, INTERVAL = topology.WINDOW_SECONDS, 5
VALUES = {
    "slurm": {"topology": "block"},
    "syncer": {"topologyLabels": {"block": LABEL}, "topologyMinIntervalSeconds": INTERVAL},
    "nodepools": {
        "cpu": None,
        "a": {**POOL, "topology": {"block": "b1"}},
        "b": {**POOL, "topology": {"block": "b2"}},
    },
    "partitions": {"main": {"pools": ["a", "b"]}},
}
NODES = tuple(node for nodes in BLOCKS.values() for node in nodes)


blocks = cluster_of_its_own("topology", VALUES, LocalCluster, idle=NODES)


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
        mark = blocks.log_offset(CONTROLLER)
        blocks.kubectl("label", "--overwrite", "node", "local-slonk-b-1", f"{LABEL}=nvl1")
        moved = {"nvl1": ["slonk-a-0", "slonk-b-0", "slonk-b-1"], "nvl2": ["slonk-a-1"]}
        wait_for("slonk-b-1 in nvl1", lambda: _blocks(blocks) == moved)
        # Seconds after the last reconfigure: the window decides, not the default 30 s pace.
        held = re.search(r"placement changed: .*; applied in (\d+) s", blocks.log(CONTROLLER, mark))
        assert held and int(held[1]) <= WINDOW, held
    finally:
        for node in NODES:
            blocks.kubectl("label", "node", f"local-{node}", f"{LABEL}-")
    wait_for("the pools' own blocks back", lambda: _blocks(blocks) == BLOCKS)


# A user's `squeue` in a loop, timed (ms) in the login pod, until the test touches the stop file.
PROBE = (
    "rm -f ~/.probe-stop ~/.probe.out; "
    "while [ ! -e ~/.probe-stop ]; do s=$(date +%s%N); squeue --noheader >/dev/null 2>&1; "
    'r=$?; e=$(date +%s%N); echo "$r $(( (e - s) / 1000000 ))" >> ~/.probe.out; done'
)


def _flap(cluster: LocalCluster, node: str, values: list[str]) -> float:
    """Set (or, for "", remove) the node's label to each value as fast as the API takes them
    (one client, one connection: a kubectl process per change took up to a second each on a
    loaded machine, and the flap outlasted the window), as whoever may label a Node can;
    returns how long it took."""
    from kubernetes import client

    nodes = client.CoreV1Api(cluster.kube_client())
    started = time.monotonic()
    for value in values:
        nodes.patch_node(node, {"metadata": {"labels": {LABEL: value or None}}})
    return time.monotonic() - started


def _probed(user: testinfra.host.Host, at_least: int = 1) -> list[tuple[int, int]]:
    """The probe's (exit status, milliseconds) so far; [] until it has `at_least` of them."""
    out = user.check_output("cat ~/.probe.out 2>/dev/null || true")
    found = [(int(f[0]), int(f[1])) for f in map(str.split, out.splitlines()) if len(f) == 2]
    return found if len(found) >= at_least else []


def _starts(cluster: LocalCluster, mark: int) -> int:
    """slurmctld's (re-)executions past `mark`: each logs that it started, once."""
    return cluster.log(CONTROLLER, mark).count(STARTED)


def test_a_flapping_label_reconfigures_a_bounded_number_of_times_while_squeue_answers(
    blocks: LocalCluster,
) -> None:
    """Whoever may label a Node flaps slonk-b-1's block label 20+ times, as fast as they can.
    Flapped back to where it was: slurmctld is not reconfigured at all. Flapped to a new
    block: reconfigured once (at most once more per INTERVAL the flap lasted),
    on the last value; a user's `squeue` answers every time meanwhile."""
    node, user = "local-slonk-b-1", blocks.user()
    mark = blocks.log_offset(CONTROLLER)
    # The first change is seen before the rest follow: a flap faster than the syncer's pass
    # could otherwise leave nothing for it to see, and nothing to say.
    started = time.monotonic()
    _flap(blocks, node, ["nvl1"])
    wait_for(
        "the syncer's word on the first change",
        lambda: "placement changed" in blocks.log(CONTROLLER, mark),
    )
    _flap(blocks, node, ["", "nvl1"] * 9 + [""])
    took = time.monotonic() - started  # the window opened after `started`: it holds the flap
    if took < WINDOW:  # one window held it all: the labels came back, nothing to apply
        wait_for(
            "the syncer's word on the flap that came back",
            lambda: "came back to the applied topology" in blocks.log(CONTROLLER, mark),
            timeout=WINDOW + INTERVAL + 30,
        )
    else:  # a machine too slow for one window: its windows applied what each ended on
        wait_for("the pools' own blocks", lambda: _blocks(blocks) == BLOCKS, timeout=90)
    allowed = 0 if took < WINDOW else 1 + int(took // INTERVAL)
    assert _starts(blocks, mark) <= allowed, f"20 changes in {took:.1f} s"
    assert _blocks(blocks) == BLOCKS

    probe = subprocess.Popen(
        [*SLONK, "local", "ssh", "demo", "--state-dir", str(blocks.state_dir), "--", PROBE],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    moved = {"b1": ["slonk-a-0", "slonk-a-1", "slonk-b-1"], "b2": ["slonk-b-0"]}
    try:
        wait_for("squeue probed", lambda: _probed(user))
        mark = blocks.log_offset(CONTROLLER)
        took = _flap(blocks, node, ["b1", "b2"] * 10 + ["b1"])
        wait_for(
            "slonk-b-1 in b1",
            lambda: _blocks(blocks) == moved,
            timeout=WINDOW + INTERVAL + 30,
        )
        starts = _starts(blocks, mark)
        assert 1 <= starts <= 1 + int(took // INTERVAL), (
            f"21 changes in {took:.1f} s: {starts} reconfigures"
        )
        # Its word comes once slurmctld answers again, which may be after the blocks show.
        said = wait_for(
            "the syncer's word on what it coalesced",
            lambda: [x for x in blocks.log(CONTROLLER, mark).splitlines() if "coalesced into" in x],
        )
        print(said[-1])
        seen = len(_probed(user))  # a few more answers: the probe's span the re-execution
        probed = wait_for("squeue after the reconfigure", lambda: _probed(user, seen + 3))
    finally:
        user.run("touch ~/.probe-stop")
        probe.wait(timeout=60)
        blocks.kubectl("label", "node", node, f"{LABEL}-")
    failed = [ms for rc, ms in probed if rc != 0]
    worst, usual = max(ms for _, ms in probed), statistics.median(ms for _, ms in probed)
    print(
        f"squeue during the flap: {len(probed)} calls, median {usual} ms, worst {worst} ms, "
        f"{len(failed)} failed; {starts} reconfigure(s) for 21 label changes in {took:.1f} s"
    )
    assert not failed, f"squeue failed during the flap: {probed}"
    wait_for("the pools' own blocks back", lambda: _blocks(blocks) == BLOCKS, timeout=90)
