"""`slonk local` lifecycle rules: the watcher's verdict in a pod log, the order `down` stops
pods in, when a node counts as up, and values checked before anything changes."""

from __future__ import annotations

import re
import shutil

import pytest

from slonk import watch
from slonk.config.spec import SpecError
from slonk.local import cluster as local
from slonk.local.manifests import Plan
from slonk.local.upgrade import LogTail, verdict


@pytest.mark.parametrize(
    ("message", "word"),
    [
        ("applied cluster.yaml change: rewrote slurm.conf", "applied"),
        ("applied cluster.yaml change: no change to the Slurm configuration", "applied"),
        ("refused cluster.yaml change, running configuration kept: x: could not", "refused"),
        ("could not apply cluster.yaml change, will retry: Slurm did not take it", "could not"),
    ],
)
def test_the_watchers_verdict_is_read_from_its_own_log_line(capsys, message, word):
    watch.log(message)
    line = capsys.readouterr().err
    assert verdict(line) == (word, line.strip())
    # podman's k8s-file log puts a time, the stream and a tag before the line.
    assert verdict(f"2026-11-22T10:00:00.1+00:00 stderr F {line}") == (word, line.strip())


@pytest.mark.parametrize(
    "line",
    [
        "slonk watch-config: watching /etc/slonk/cluster.yaml every 1 s",
        "slurmctld: error: applied nothing, refused",  # not the watcher's
        # another daemon quoting a user's words: the watcher's line starts a log line
        "slurmctld: error: invalid name 'slonk watch-config: applied cluster.yaml change'",
        "slonk watch-config: applied\nslonk watch-config: refused",
        "",
    ],
)
def test_other_lines_are_no_verdict(line):
    assert verdict(line) is None


def test_a_log_tail_reads_whole_lines_from_its_offset(tmp_path):
    log = tmp_path / "log"
    log.write_bytes(b"before\n")
    tail = LogTail.at_end(log)
    assert tail.new_lines() == []
    with open(log, "ab") as out:
        out.write(b"one\ntw")
    assert tail.new_lines() == ["one"]
    with open(log, "ab") as out:
        out.write(b"o\n")
    assert tail.new_lines() == ["two"]


def test_down_stops_the_controller_last():
    roles = {"slonk-controller-0": "controller", "slonk-login-0": "login",
             "slonk-ldap-0": "ldap", "slonk-cpu-0": "worker", "slonk-cpu-1": "worker"}
    assert local.stop_order(roles) == [
        ["slonk-login-0", "slonk-ldap-0", "slonk-cpu-0", "slonk-cpu-1"], ["slonk-controller-0"]]
    assert local.stop_order({}) == []


@pytest.mark.parametrize(
    ("state", "up"),
    [("idle", True), ("allocated", True), ("mixed", True), ("completing", True),
     ("drained", True), ("draining", True), ("idle+cloud", True),
     ("idle*", False), ("down", False), ("down*", False), ("unknown", False),
     ("drained*", False), ("allocated*", False), ("", False)],
)
def test_a_node_is_up_when_registered_and_answering_whatever_it_runs(state, up):
    assert local.node_is_up(state) is up


@pytest.mark.parametrize(
    ("document", "error"),
    [
        (b"clusterName: Bad\n", "clusterName: 'Bad' must be lowercase"),
        (b"clusterName: [\n", "not valid YAML"),
        (b"- a list\n", "expected a mapping"),
    ],
)
def test_a_cluster_yaml_the_pods_would_refuse_is_refused_before_anything_changes(
    document, error
):
    objects = Plan("default", configmaps={"slonk-cluster": {"cluster.yaml": document}})
    where = "ConfigMap slonk-cluster, cluster.yaml: "
    with pytest.raises(SpecError, match=f"^{re.escape(where)}.*{re.escape(error)}"):
        local.cluster_spec(objects)


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_a_value_only_slurm_can_refuse_renders(tmp_path):
    objects, spec = local.render(
        local.Cluster(tmp_path), {"slurm": {"slurmConf": {"SelectType": "select/bogus"}}}
    )
    assert spec.slurm_conf["SelectType"] == "select/bogus"  # Slurm's to refuse, not ours
    assert "slonk-controller-0" in [p.name for p in objects.pods]
