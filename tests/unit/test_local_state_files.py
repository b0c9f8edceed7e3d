"""A local cluster's state files, empty, corrupt, wrong-typed or out of step with the pods
that run, stop the command that reads them with one line naming the file, and it acts on
nothing: no traceback, no node taken for gone, no value dropped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slonk import cli
from slonk.local import fake_apiserver
from slonk.local.state import Cluster, read_pod_spec, write_pod_spec, write_record
from slonk.local.statefiles import StateFileError

PODS = {
    "slonk-controller-0": {"role": "controller", "address": "10.73.0.10"},
    "slonk-cpu-0": {"role": "worker", "address": "10.73.0.11"},
    "slonk-cpu-1": {"role": "worker", "address": "10.73.0.12"},
    "slonk-login-0": {"role": "login", "address": "10.73.0.13"},
}


def _cluster(tmp_path: Path) -> Cluster:
    """A cluster as `up` leaves it: the record, and a template for each pod it started."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    cluster = Cluster(state)
    write_record(cluster, {"prefix": "slk0", "runtime": "host", "pods": PODS})
    for name in PODS:
        cluster.pod_dir(name).mkdir(parents=True)
        write_pod_spec(cluster, name, {"hostname": name, "env": {}, "files": {}, "command": []})
    cluster.values_file.write_text("users:\n- name: alice\n")
    return cluster


def _pods(**changes: object) -> dict[str, object]:
    pods: dict[str, object] = {**PODS, **changes}
    return {name: pod for name, pod in pods.items() if pod is not None}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty"),
        ('{"pods": {"slonk-contr', "not valid JSON"),
        ("\xff\xfe", "not UTF-8 text"),
        ("[]", "expected a JSON object, got list"),
        ("{}", "pods: expected the pods, got None"),
        ('{"pods": {}}', "pods: expected the pods"),
        ('{"pods": ["slonk-controller-0"]}', "pods: expected the pods"),
        (json.dumps({"pods": _pods(**{"../../etc": {"role": "worker", "address": "10.73.0.9"}})}),
         "pods.../../etc: not a pod name"),
        (json.dumps({"pods": _pods(**{"slonk-cpu-1": "up"})}), "pods.slonk-cpu-1: expected an"),
        (json.dumps({"pods": _pods(**{"slonk-cpu-1": {"address": "10.73.0.12"}})}),
         "pods.slonk-cpu-1.role: expected a role"),
        (json.dumps({"pods": _pods(**{"slonk-cpu-1": {"role": "worker", "address": "-oX"}})}),
         "pods.slonk-cpu-1.address: expected an IPv4 address, got -oX"),
        (json.dumps({"pods": _pods(**{"slonk-cpu-1": {"role": "worker", "address": 7}})}),
         "pods.slonk-cpu-1.address: expected an IPv4 address"),
        (json.dumps({"pods": _pods(**{"slonk-cpu-1": {**PODS["slonk-cpu-0"], "role": "x"}})}),
         "pods: two pods share an address"),
        (json.dumps({"pods": _pods(**{"slonk-controller-0": None})}),
         "pods: 0 controllers listed, expected 1"),
        (json.dumps({"pods": PODS, "runtime": "docker"}), "runtime: got docker"),
        (json.dumps({"pods": PODS, "prometheus": "yes"}), "prometheus: got yes"),
    ],
)  # fmt: skip
def test_a_bad_record_is_refused_naming_the_file(tmp_path, text, problem):
    cluster = _cluster(tmp_path)
    cluster.record_file.write_bytes(text.encode("latin-1"))
    with pytest.raises(StateFileError) as refused:
        cluster.record()
    assert str(refused.value).startswith(f"{cluster.record_file}: {problem}")
    assert "nothing done" in str(refused.value) and "\n" not in str(refused.value)


def test_a_record_listing_fewer_pods_takes_no_live_pod_for_gone(tmp_path):
    """The fake API server reads its pod set from the record at every relist: one without
    slonk-cpu-1 would report the running pod deleted, and the syncer drain its node."""
    cluster = _cluster(tmp_path)
    write_record(cluster, {"pods": _pods(**{"slonk-cpu-1": None})})
    message = rf"^{cluster.record_file}: lists 3 pods but not slonk-cpu-1, which has a pod dir"
    with pytest.raises(StateFileError, match=message):
        fake_apiserver.KubeletBackend(cluster).pods()
    with pytest.raises(StateFileError, match=message):
        cluster.pod_names("worker")


def test_down_with_a_bad_record_stops_and_removes_nothing(tmp_path, capsys):
    cluster = _cluster(tmp_path)
    cluster.record_file.write_text('{"pods": ')
    before = sorted(p.relative_to(cluster.state_dir) for p in cluster.state_dir.rglob("*"))
    assert cli.main(["local", "down", "--state-dir", str(cluster.state_dir)]) == 1
    error = capsys.readouterr().err
    assert error.startswith(f"slonk: error: {cluster.record_file}: not valid JSON")
    assert error.count("\n") == 1
    assert sorted(p.relative_to(cluster.state_dir) for p in cluster.state_dir.rglob("*")) == before


@pytest.mark.parametrize(
    "command", [["status"], ["exec", "slonk-cpu-0", "--", "id"], ["ssh", "alice"]]
)
def test_a_corrupt_record_is_one_line_and_no_traceback(tmp_path, command):
    cluster = _cluster(tmp_path)
    cluster.record_file.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "slonk.cli", "local", command[0], "--state-dir",
         str(cluster.state_dir), *command[1:]],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr == f"slonk: error: {cluster.record_file}: empty; nothing done (move it " \
        "aside and `slonk local down` stops whatever this cluster runs)\n"  # fmt: skip


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty: the values in force are lost"),
        ("\n  \n", "empty: the values in force are lost"),
        ("users: [\n", "not valid YAML at line 2"),
        ("- alice\n", "expected a mapping of values, got list"),
        ("null\n", "expected a mapping of values, got null"),
        ("# all values\n", "expected a mapping of values, got null"),
    ],
)
def test_values_in_force_that_are_no_values_are_refused(tmp_path, text, problem):
    cluster = _cluster(tmp_path)
    cluster.values_file.write_text(text)
    with pytest.raises(StateFileError, match=rf"^{cluster.values_file}: {problem}; nothing done"):
        cluster.values()


def test_missing_values_in_force_are_refused_and_none_are_values(tmp_path):
    cluster = _cluster(tmp_path)
    assert cluster.values() == {"users": [{"name": "alice"}]}
    cluster.values_file.write_text("{}\n")  # `up` without -f writes this
    assert cluster.values() == {}
    cluster.values_file.unlink()
    with pytest.raises(StateFileError, match=rf"^{cluster.values_file}: missing"):
        cluster.values()


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("", "empty"),
        ("{", "not valid JSON"),
        ({"hostname": "slonk-cpu-1", "env": {}, "files": {}, "command": []},
         "hostname: slonk-cpu-1, not the pod's name slonk-cpu-0"),
        ({"hostname": "slonk-cpu-0", "env": ["A=1"], "files": {}, "command": []}, "env: expected"),
        ({"hostname": "slonk-cpu-0", "env": {"A": 1}, "files": {}, "command": []}, "env: expected"),
        ({"hostname": "slonk-cpu-0", "env": {"-u": "x"}, "files": {}, "command": []},
         "env: -u is no variable name"),
        ({"hostname": "slonk-cpu-0", "env": {"A=B": "x"}, "files": {}, "command": []},
         "env: A=B is no variable name"),
        ({"hostname": "slonk-cpu-0", "env": {}, "files": None, "command": []}, "files: expected"),
        ({"hostname": "slonk-cpu-0", "env": {}, "files": {}, "command": "sh"}, "command: expected"),
    ],
)  # fmt: skip
def test_a_bad_pod_template_is_refused(tmp_path, spec, problem):
    cluster = _cluster(tmp_path)
    path = cluster.pod_dir("slonk-cpu-0") / "pod.json"
    path.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    with pytest.raises(StateFileError, match=rf"^{path}: {problem}"):
        read_pod_spec(cluster, "slonk-cpu-0")


def test_a_missing_pod_template_is_refused(tmp_path):
    cluster = _cluster(tmp_path)
    (cluster.pod_dir("slonk-cpu-0") / "pod.json").unlink()
    with pytest.raises(StateFileError, match=r"slonk-cpu-0/pod.json: missing"):
        read_pod_spec(cluster, "slonk-cpu-0")
