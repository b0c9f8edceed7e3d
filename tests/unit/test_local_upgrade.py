"""`slonk local` lifecycle rules: the watcher's verdict in a pod log, the order `down` stops
pods in, when a node counts as up, and values checked before anything changes."""

from __future__ import annotations

import re
import shutil

import pytest

from slonk.config.spec import SpecError
from slonk.local import cluster as local
from slonk.local import release, upgrade
from slonk.local.manifests import LocalModeError, Plan
from slonk.local.state import write_record
from slonk.local.statefiles import StateFileError
from slonk.local.upgrade import LogTail, verdict
from slonk.pod import config_watch
from slonk.slurm.slurm_state import parse_nodes

from . import slurm_json


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
    config_watch.log(message)
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
    tail = LogTail(log, offset=log.stat().st_size)
    assert tail.new_lines() == []
    with open(log, "ab") as out:
        out.write(b"one\ntw")
    assert tail.new_lines() == ["one"]
    with open(log, "ab") as out:
        out.write(b"o\n")
    assert tail.new_lines() == ["two"]


def test_down_stops_the_controller_last():
    """After the workers' power-off (cluster.down), the other pods in waves."""
    roles = {
        "slonk-controller-0": "controller",
        "slonk-login-0": "login",
        "slonk-ldap-0": "ldap",
        "slonk-mariadb-0": "mariadb",
        "slonk-slurmdbd-0": "slurmdbd",
    }
    assert local.stop_order(roles) == [
        ["slonk-login-0", "slonk-ldap-0"],
        ["slonk-controller-0"],
        ["slonk-slurmdbd-0"],
        ["slonk-mariadb-0"],
    ]
    assert local.stop_order({}) == []


@pytest.mark.parametrize(
    ("state", "up"),
    [
        ("IDLE", True),
        ("ALLOCATED", True),
        ("MIXED", True),
        ("IDLE+COMPLETING", True),
        ("IDLE+DRAIN", True),
        ("MIXED+DRAIN", True),
        ("IDLE+CLOUD", True),
        ("IDLE+PLANNED", True),
        ("IDLE+NOT_RESPONDING", False),
        ("DOWN", False),
        ("DOWN+NOT_RESPONDING", False),
        ("UNKNOWN", False),
        ("UNKNOWN+NOT_RESPONDING", False),
        ("FUTURE", False),
        ("IDLE+DRAIN+NOT_RESPONDING", False),
        ("ALLOCATED+NOT_RESPONDING", False),
    ],
)
def test_a_node_is_up_when_registered_and_answering_whatever_it_runs(state, up):
    (node,) = parse_nodes(slurm_json.nodes(slurm_json.node("n", state.split("+"))))
    assert node.up is up
    assert node.schedulable is (up and "DRAIN" not in state)


class FakeController:
    """What upgrade asks the controller: Slurm's answers from real JSON, updates recorded."""

    def __init__(self, monkeypatch, nodes: str, queue: str) -> None:
        self.nodes, self.queue, self.asked = nodes, queue, []
        monkeypatch.setattr(upgrade, "_slurm", self.slurm)
        monkeypatch.setattr(
            upgrade, "node_states", lambda cluster: {n.name: n for n in parse_nodes(self.nodes)}
        )

    def slurm(self, cluster, *command):
        self.asked.append(command)
        return self.queue if command[0] == "squeue" else ""


def test_busy_nodes_are_named_from_one_squeue(monkeypatch):
    slurm = FakeController(monkeypatch, "", slurm_json.text("squeue.json"))
    with pytest.raises(LocalModeError, match=r"^cannot remove n1: n1 runs job 1\. Nothing changed"):
        upgrade._refuse_busy(None, ["n1", "n3", "n4"])  # job 2 only waits for n3
    assert slurm.asked == [("squeue", "--json", "--nodelist=n1,n3,n4")]
    upgrade._refuse_busy(None, [])
    assert len(slurm.asked) == 1


def test_a_queue_that_cannot_be_read_refuses_the_upgrade(monkeypatch):
    FakeController(monkeypatch, "", '{"jobs": [{"job_id": 7}]}')
    with pytest.raises(LocalModeError, match=r"cannot tell whether n1 run jobs: .*`job_state`"):
        upgrade._refuse_busy(None, ["n1"])


@pytest.mark.parametrize(
    ("state", "reason", "resumed"),
    [
        (["IDLE", "DRAIN"], upgrade.LEAVING_REASON, True),
        (["IDLE", "DRAIN"], "maintenance", False),  # a person drained it since
        (["IDLE", "DRAIN"], f"x {upgrade.LEAVING_REASON}", False),
        (["IDLE", "DRAIN"], f"x Reason={upgrade.LEAVING_REASON}", False),
        (["IDLE", "DRAIN"], f"{upgrade.LEAVING_REASON}\nNodeName=n", False),
        (["IDLE"], upgrade.LEAVING_REASON, False),  # resumed already
    ],
)
def test_a_leaving_drain_is_put_back_only_while_it_is_ours(monkeypatch, state, reason, resumed):
    shown = slurm_json.nodes(slurm_json.node("n", state, reason), slurm_json.node("m", ["IDLE"]))
    slurm = FakeController(monkeypatch, shown, "")
    upgrade._resume(None, "n")
    assert slurm.asked == ([("scontrol", "update", "nodename=n", "state=resume")] if resumed
                           else [])  # fmt: skip


@pytest.mark.parametrize(
    ("document", "error"),
    [
        (b"clusterName: Bad\n", "clusterName: 'Bad' must be lowercase"),
        (b"clusterName: [\n", "not valid YAML"),
        (b"- a list\n", "expected a mapping"),
    ],
)
def test_a_cluster_yaml_the_pods_would_refuse_is_refused_before_anything_changes(document, error):
    objects = Plan("default", configmaps={"slonk-cluster": {"cluster.yaml": document}})
    where = "ConfigMap slonk-cluster, cluster.yaml: "
    with pytest.raises(SpecError, match=f"^{re.escape(where)}.*{re.escape(error)}"):
        release.cluster_spec(objects)


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_a_value_only_slurm_can_refuse_renders(tmp_path):
    objects, spec = release.render(
        local.Cluster(tmp_path), {"slurm": {"slurmConf": {"SelectType": "select/bogus"}}}
    )
    assert spec.slurm_conf["SelectType"] == "select/bogus"  # Slurm's to refuse, not ours
    assert "slonk-controller-0" in [p.name for p in objects.pods]


@pytest.mark.parametrize("stored", ["", "\n", "users: [\n", "- alice\n"])
def test_upgrade_over_values_in_force_that_are_no_values_is_refused(tmp_path, monkeypatch, stored):
    """An empty values.yaml read as no values would upgrade to the chart's defaults: every
    earlier value (static users, hooks, the SSH CA) dropped, and `upgrade` says success."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    cluster = local.Cluster(state)
    pods = {"slonk-controller-0": {"role": "controller", "address": "10.73.0.10"}}
    write_record(cluster, {"pods": pods})
    cluster.values_file.write_text(stored)
    new = tmp_path / "new.yaml"
    new.write_text("slurm:\n  slurmConf:\n    MaxJobCount: 20000\n")

    def render(*args):
        raise AssertionError("rendered: the upgrade went on")

    monkeypatch.setattr(upgrade, "render", render)
    with pytest.raises(StateFileError, match=rf"^{cluster.values_file}: .*; nothing done"):
        upgrade.upgrade(state, [new])
    assert cluster.values_file.read_text() == stored
    assert sorted(p.name for p in state.iterdir()) == [
        "cluster.json",
        "upgrade.lock",
        "values.yaml",
    ]


def test_upgrade_layers_each_new_file_over_the_values_in_force(tmp_path, monkeypatch):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    cluster = local.Cluster(state)
    write_record(cluster, {"pods": {"slonk-controller-0": {"role": "controller",
                                                          "address": "10.73.0.10"}}})  # fmt: skip
    cluster.values_file.write_text("users: [{name: alice}]\nslurm: {slurmConf: {A: '1'}}\n")
    first, second = tmp_path / "1.yaml", tmp_path / "2.yaml"
    first.write_text("slurm: {slurmConf: {B: '2'}}\nhooks: off\n")
    second.write_text("hooks: {repo: x}\n")
    seen = []

    def render(cluster, user):
        seen.append(user)
        raise LocalModeError("stop here")

    monkeypatch.setattr(upgrade, "render", render)
    with pytest.raises(LocalModeError, match="stop here"):
        upgrade.upgrade(state, [first, second])
    assert seen == [
        {"users": [{"name": "alice"}], "slurm": {"slurmConf": {"A": "1", "B": "2"}},
         "hooks": {"repo": "x"}}
    ]  # fmt: skip
