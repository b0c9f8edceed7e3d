"""`slonk local up --prometheus`: the targets and configuration Prometheus is given (checked
by Prometheus's own promtool), and the relay that carries the host's loopback to it."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from slonk.config.model import ClusterSpec, MetricsSettings
from slonk.local import forward, prometheus
from slonk.local.manifests import LocalModeError
from slonk.local.state import Cluster, write_record

PODS = {
    "slonk-controller-0": {"role": "controller", "address": "10.73.0.10"},
    "slonk-gpu-0": {"role": "worker", "address": "10.73.0.11"},
    "slonk-gpu-1": {"role": "worker", "address": "10.73.0.12"},
    "slonk-login-0": {"role": "login", "address": "10.73.0.13"},
    "slonk-slurmdbd-0": {"role": "slurmdbd", "address": "10.73.0.14"},
}


def _cluster(tmp_path: Path, **record: object) -> Cluster:
    cluster = Cluster(tmp_path)
    write_record(cluster, {"pods": PODS, **record})
    return cluster


def _spec(port: int | None = 9341) -> ClusterSpec:
    metrics = MetricsSettings(port=port) if port else None
    return ClusterSpec(cluster_name="local", release="slonk", metrics=metrics)


def test_every_exporter_pod_is_a_target_on_the_metrics_port(tmp_path: Path):
    groups = prometheus.targets(_cluster(tmp_path), _spec(9500))
    assert groups == [
        {"targets": [f"10.73.0.{i}:9500"], "labels": {"pod": pod, "role": role}}
        for i, pod, role in [
            (10, "slonk-controller-0", "controller"),
            (11, "slonk-gpu-0", "worker"),
            (12, "slonk-gpu-1", "worker"),
        ]
    ]
    assert prometheus.targets(_cluster(tmp_path), _spec(None)) == []


def test_prometheus_is_on_only_when_up_said_so(tmp_path: Path):
    assert not prometheus.enabled(Cluster(tmp_path))  # no cluster at all
    assert not prometheus.enabled(_cluster(tmp_path))  # a record from before --prometheus
    assert prometheus.enabled(_cluster(tmp_path, prometheus=True))


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (package prometheus)")
def test_promtool_accepts_the_configuration_and_targets(tmp_path: Path):
    cluster = _cluster(tmp_path)
    cluster.prometheus_dir.mkdir()
    prometheus.write_targets(cluster, _spec())
    path = cluster.prometheus_dir / "prometheus.yml"
    path.write_text(yaml.safe_dump(prometheus.config(cluster)))
    done = subprocess.run(
        ["promtool", "check", "config", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    written = json.loads((cluster.prometheus_dir / prometheus.TARGETS_FILE).read_text())
    assert written == prometheus.targets(cluster, _spec())


def test_prometheus_files_go_with_down_and_its_data_stays(tmp_path: Path):
    cluster = Cluster(tmp_path)
    assert cluster.prometheus_dir in cluster.removed_by_down
    assert cluster.prometheus_data not in cluster.removed_by_down


def test_the_relay_takes_the_port_asked_for_or_any_when_taken():
    first = forward.listen(0)
    taken = first.getsockname()[1]
    second = forward.listen(taken)
    with first, second:
        assert second.getsockname()[1] not in (0, taken)
        assert second.getsockname()[0] == "127.0.0.1"


def test_the_relay_carries_both_ways_and_the_end_of_each():
    upstream = socket.create_server(("127.0.0.1", 0))
    relay = forward.listen(0)

    def echo_upper() -> None:
        conn, _ = upstream.accept()
        with conn:
            data = b""
            while chunk := conn.recv(4096):  # until the client's end comes through
                data += chunk
            conn.sendall(data.upper())

    threading.Thread(target=echo_upper, daemon=True).start()
    target = ("127.0.0.1", upstream.getsockname()[1])
    serving = threading.Thread(target=forward.serve, args=(relay, target), daemon=True)
    serving.start()
    with socket.create_connection(relay.getsockname(), timeout=10) as client:
        client.sendall(b"x" * 200_000)
        client.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    assert answer == b"X" * 200_000
    upstream.close()
    relay.shutdown(socket.SHUT_RDWR)  # ends the blocked accept: the relay stops, quietly
    relay.close()
    serving.join(timeout=10)
    assert not serving.is_alive()


def test_prometheus_without_metrics_is_refused_before_anything_starts():
    with pytest.raises(LocalModeError, match=r"metrics\.enabled is false"):
        prometheus.check(_spec(None))
