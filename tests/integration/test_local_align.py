"""Kubernetes and Slurm agree about every node, on the session's local cluster: real Slurm, the
syncer in the controller pod, the Kubernetes side through local mode's fake API server and
real `kubectl` with `slonk local kubeconfig`'s admin rights (the operator's)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from slonk.base import paths
from slonk.slurm import reasons

from ..support.cluster import SLONK, LocalCluster, wait_for

CONTROLLER = "slonk-controller-0"


def _cause(cluster: LocalCluster, node: str) -> reasons.Cause | None:
    found = cluster.node_states().get(node)
    return found.cause if found else None


def _k8s(word: str) -> reasons.Cause:
    return reasons.Cause(reasons.K8S, word)


def _scontrol(cluster: LocalCluster, *args: str) -> None:
    cluster.pod(CONTROLLER).check_output("scontrol " + " ".join(args))


def _drain_by_hand(cluster: LocalCluster, node: str, reason: str) -> None:
    """A person's drain, once the syncer has seen it (its history says so): a pass that read
    Slurm before it could still drain over the person's reason, since Slurm's update has no
    compare-and-set; passes run one at a time, so every later one sees the drain."""
    recorded = len(cluster.node_history())
    _scontrol(cluster, "update", f"nodename={node}", "state=drain", f"reason={reason}")
    wait_for(
        f"the syncer to see {node} drained by hand",
        lambda: (
            ("drain", "human")
            in [(e.event, e.cause) for e in cluster.node_history()[recorded:] if e.node == node]
        ),
    )


def _syncer_pass(cluster: LocalCluster) -> None:
    """Returns once the syncer has made a whole pass begun after the call (it saves its
    stats after each): what a test before changed (a quarantine lifted) is in the node
    history by then, and no test here counts it as its own."""

    def saved() -> str:
        return cluster.pod(CONTROLLER).run(f"cat {paths.SYNCER_STATS}").stdout

    for _ in range(2):
        before = saved()
        wait_for("a pass of the syncer", lambda before=before: saved() != before)


@pytest.fixture
def aligned(healthy: LocalCluster) -> Iterator[LocalCluster]:
    """The healthy cluster, its node history caught up; its Kubernetes Nodes put back as
    they were after the test."""
    _syncer_pass(healthy)
    yield healthy
    for node in ("local-slonk-cpu-0", "local-slonk-cpu-1"):
        healthy.kubectl("uncordon", node)
        healthy.kubectl("annotate", "node", node, "slonk.io/goal-", "slonk.io/goal-reason-")
    for node in ("slonk-cpu-0", "slonk-cpu-1"):
        if healthy.node_states()[node].cause is None and healthy.node_states()[node].drained:
            _scontrol(healthy, "update", f"nodename={node}", "state=resume")
    healthy.wait_idle()


def test_cordon_drains_only_while_it_holds_and_leaves_a_persons_drain(
    aligned: LocalCluster,
) -> None:
    recorded = len(aligned.node_history())
    _drain_by_hand(aligned, "slonk-cpu-1", "hands_off")
    aligned.kubectl("cordon", "local-slonk-cpu-0")
    aligned.kubectl("cordon", "local-slonk-cpu-1")
    wait_for(
        "slonk-cpu-0 drained as cordoned",
        lambda: _cause(aligned, "slonk-cpu-0") == _k8s("cordoned"),
    )
    assert aligned.nodes()["slonk-cpu-1"] == ("idle+drain", "hands_off")

    # The history is what the syncer saw at each pass: its drain, once it has seen it (a
    # resume before its next pass would leave neither in the history).
    def seen(node: str) -> list[tuple[str, str]]:
        return [(e.event, e.cause) for e in aligned.node_history()[recorded:] if e.node == node]

    wait_for("the syncer to see its drain", lambda: seen("slonk-cpu-0") == [("drain", "k8s")])
    # Resumed by hand while still cordoned: drained again (the syncer says so past this mark).
    mark = aligned.log_offset(CONTROLLER)
    _scontrol(aligned, "update", "nodename=slonk-cpu-0", "state=resume")
    wait_for(
        "the syncer to drain slonk-cpu-0 again",
        lambda: (
            "drain slonk-cpu-0: slonk:k8s:cordoned" in aligned.log(CONTROLLER, mark)
            and _cause(aligned, "slonk-cpu-0") == _k8s("cordoned")
        ),
    )

    aligned.kubectl("uncordon", "local-slonk-cpu-0")
    aligned.kubectl("uncordon", "local-slonk-cpu-1")
    wait_for("slonk-cpu-0 resumed", lambda: aligned.nodes()["slonk-cpu-0"][0] == "idle")
    assert aligned.nodes()["slonk-cpu-1"] == ("idle+drain", "hands_off")

    # The node history holds each change, whoever made it (the person's resume too), once.
    changes = [("drain", "k8s"), ("resume", "k8s"), ("drain", "k8s"), ("resume", "k8s")]
    wait_for("slonk-cpu-0's changes in the history", lambda: seen("slonk-cpu-0") == changes)
    assert seen("slonk-cpu-1") == [("drain", "human")]
    stats = json.loads(aligned.pod(CONTROLLER).check_output(f"cat {paths.SYNCER_STATS}"))
    assert stats["passes"] > 0 and stats["lastPassSeconds"] > 0
    assert stats["actions"]["drain"] >= 2 and stats["actions"]["resume"] >= 1


def test_slurms_view_shows_on_the_pods(aligned: LocalCluster) -> None:
    job = aligned.submit("--nodelist=slonk-cpu-1", "--output=/dev/null", "--wrap", "sleep 300")
    try:

        def shown() -> dict[str, str]:
            pod = json.loads(aligned.kubectl("get", "pod", "slonk-cpu-1", "-o", "json"))["metadata"]
            return {**pod.get("labels", {}), **pod.get("annotations", {})}

        wait_for("slonk-cpu-1 shown busy", lambda: shown().get("slonk.io/busy") == "true")
        assert shown()["slonk.io/slurm-jobs"] == "1"
        table = aligned.kubectl("get", "pods", "-L", "slonk.io/slurm-state,slonk.io/busy")
        assert any(line.startswith("slonk-cpu-1") and "true" in line for line in table.splitlines())
    finally:
        aligned.pod(CONTROLLER).run(f"scancel {job}")


def test_a_goal_survives_its_pod_and_up_lifts_only_slonks_drain(aligned: LocalCluster) -> None:
    _drain_by_hand(aligned, "slonk-cpu-1", "mine")
    for node in ("local-slonk-cpu-0", "local-slonk-cpu-1"):
        aligned.kubectl(
            "annotate",
            "--overwrite",
            "node",
            node,
            "slonk.io/goal=drain",
            "slonk.io/goal-reason=RMA 7",
        )
    wait_for(
        "slonk-cpu-0 drained for its goal", lambda: _cause(aligned, "slonk-cpu-0") == _k8s("goal")
    )
    assert "RMA 7" in aligned.nodes()["slonk-cpu-0"][1]

    # The reason corrected on the Nodes while drained: Slurm's follows; a person's stays theirs.
    for node in ("local-slonk-cpu-0", "local-slonk-cpu-1"):
        aligned.kubectl("annotate", "--overwrite", "node", node, "slonk.io/goal-reason=RMA 8")
    wait_for(
        "slonk-cpu-0's reason corrected",
        lambda: (
            aligned.nodes()["slonk-cpu-0"] == ("idle+drain", reasons.k8s("goal", "drain: RMA 8"))
        ),
    )
    assert aligned.nodes()["slonk-cpu-1"] == ("idle+drain", "mine")

    before = aligned.slurmd_started("slonk-cpu-0")
    aligned.kubectl("delete", "pod", "slonk-cpu-0")
    wait_for(
        "a new slurmd on slonk-cpu-0",
        lambda: aligned.slurmd_started("slonk-cpu-0") not in ("", before),
    )
    wait_for(
        "slonk-cpu-0 still drained for its goal",
        lambda: _cause(aligned, "slonk-cpu-0") == _k8s("goal"),
        timeout=90,
    )

    for node in ("local-slonk-cpu-0", "local-slonk-cpu-1"):
        aligned.kubectl("annotate", "--overwrite", "node", node, "slonk.io/goal=up")
    wait_for("slonk-cpu-0 back in service", lambda: aligned.nodes()["slonk-cpu-0"][0] == "idle")
    assert aligned.nodes()["slonk-cpu-1"] == ("idle+drain", "mine")


def test_align_reports_drift_and_fix_clears_it(aligned: LocalCluster) -> None:
    controller = aligned.pod(CONTROLLER)
    controller.check_output("s6-svc -wD -d /run/slonk/service/syncer")
    try:
        aligned.kubectl("cordon", "local-slonk-cpu-1")
        drift = controller.run("slonk align")
        assert drift.rc == 1, drift.stdout + drift.stderr
        row = next(line for line in drift.stdout.splitlines() if line.startswith("slonk-cpu-1"))
        assert "cordoned" in row and "drain slonk:k8s:cordoned" in row
        fixed = controller.run("slonk align --fix")
        assert fixed.rc == 1 and "drain slonk-cpu-1" in fixed.stdout
        assert _cause(aligned, "slonk-cpu-1") == _k8s("cordoned")
        again = controller.run("slonk align")
        assert again.rc == 0, again.stdout
    finally:
        controller.run("s6-svc -u /run/slonk/service/syncer")


def test_lending_a_node_waits_for_its_job_and_gives_it_back_idle(aligned: LocalCluster) -> None:
    """Scale the pool 2 -> 1 while a job runs on ordinal 1: the job finishes, then the pod
    goes and Slurm shows the node powered down; scaled back to 2, it returns idle."""
    user = aligned.user()
    user.run("rm -f ~/lend-go ~/lend.out")
    job = aligned.submit(
        "--nodelist=slonk-cpu-1", "--output=lend.out",
        "--wrap", "while [ ! -e ~/lend-go ]; do sleep 0.2; done; echo finished",
    )  # fmt: skip
    wait_for(f"job {job} running", lambda: aligned.jobs().get(job) == "RUNNING")
    scale = subprocess.Popen(
        [*in_controller(aligned), "slonk", "pool", "scale", "cpu", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(
            "slonk-cpu-1 drained as lent", lambda: _cause(aligned, "slonk-cpu-1") == _k8s("lent")
        )
        assert aligned.jobs().get(job) == "RUNNING", "lending killed nothing"
        assert scale.poll() is None, "the pool waits for the job"
        user.check_output("touch ~/lend-go")
        out, err = scale.communicate(timeout=120)
        assert scale.returncode == 0, err
        assert "lent: slonk-cpu-1" in out
        assert user.check_output("cat ~/lend.out").strip() == "finished"
        wait_for(
            "slonk-cpu-1 powered down",
            lambda: aligned.node_states()["slonk-cpu-1"].powered_down,
            timeout=90,
        )
        assert aligned.node_states()["slonk-cpu-1"].drained
        assert "slonk-cpu-1" not in aligned.kubectl("get", "pods", "-o", "name")
    finally:
        if scale.poll() is None:
            scale.kill()
        user.run("touch ~/lend-go")
        aligned.kubectl("scale", "statefulset", "slonk-cpu", "--replicas=2")
    wait_for(
        "slonk-cpu-1 given back idle",
        lambda: aligned.nodes()["slonk-cpu-1"][0] == "idle",
        timeout=120,
    )


def in_controller(cluster: LocalCluster) -> list[str]:
    """`slonk local exec` into the controller: `slonk pool scale` runs there, with the
    controller's ServiceAccount, as it would under `kubectl exec`."""
    return [*SLONK, "local", "exec", CONTROLLER, "--state-dir", str(cluster.state_dir), "--"]
