"""A local cluster's state dir: a pod's log, read whole, from an offset, or from its current
container's start (the log runs on across restarts)."""

from __future__ import annotations

from pathlib import Path

from slonk.local.state import Cluster

POD = "slonk-cpu-0"


def _append(cluster: Cluster, data: bytes) -> None:
    with open(cluster.log_file(POD), "ab") as log:
        log.write(data)


def test_a_pod_without_a_log_has_an_empty_one(tmp_path: Path):
    cluster = Cluster(tmp_path)
    assert (cluster.log(POD), cluster.log_offset(POD), cluster.container_log_offset(POD)) == (
        "", 0, 0)  # fmt: skip


def test_a_log_offset_leaves_out_what_came_before(tmp_path: Path):
    cluster = Cluster(tmp_path)
    cluster.pod_dir(POD).mkdir(parents=True)
    _append(cluster, "before ✓\n".encode())
    offset = cluster.log_offset(POD)
    _append(cluster, b"after\n")
    assert cluster.log(POD, since=offset) == "after\n"
    assert cluster.log(POD) == "before ✓\nafter\n"  # all of it, as ever


def test_the_current_containers_log_leaves_out_earlier_containers(tmp_path: Path):
    cluster = Cluster(tmp_path)
    cluster.pod_dir(POD).mkdir(parents=True)
    cluster.mark_container_start(POD)
    _append(cluster, b"first container: failed\n")
    cluster.mark_container_start(POD)
    _append(cluster, b"second container\n")
    assert cluster.log(POD, since=cluster.container_log_offset(POD)) == "second container\n"


def test_a_log_started_afresh_is_all_the_current_containers(tmp_path: Path):
    cluster = Cluster(tmp_path)
    cluster.pod_dir(POD).mkdir(parents=True)
    _append(cluster, b"an earlier container's long log\n")
    cluster.mark_container_start(POD)
    cluster.log_file(POD).write_bytes(b"new\n")  # a runtime that starts its log over
    assert cluster.log(POD, since=cluster.container_log_offset(POD)) == "new\n"
