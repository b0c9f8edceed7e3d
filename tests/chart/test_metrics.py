"""Metrics in the chart (values: metrics): the port named `metrics` on the controller's and
the workers' containers and the controller's Service, who may scrape it, `metrics: {port}` in
cluster.yaml, the PodMonitor, and the Grafana dashboard, whose PromQL names only series the exporter
produces."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from slonk.config.spec import parse_spec
from slonk.kube import chart

from ..support.exporter import served_series
from .netpol import Endpoint, allowed, selects
from .test_security import OUTSIDE, STRANGER, _docs, _get, _pods, _policies
from .test_validity import _template_error

DASHBOARD = chart.default_chart() / "dashboards" / "slonk.json"
PORT = 9341
SCRAPER = Endpoint("10.244.7.7", "monitoring", {"app.kubernetes.io/name": "prometheus"})
MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
ON = {"metrics": {"podMonitor": {"enabled": True}, "dashboard": {"enabled": True}}}


def exporter_series() -> dict[str, frozenset[str]]:
    """{series name: its labels} of everything the exporter serves, from a real scrape."""
    return served_series()


# ---------------------------------------------------------------------------------------
# PromQL, just enough of it to find the series and labels an expression names.
KEYWORDS = frozenset(
    "by without on ignoring group_left group_right bool offset and or unless atan2".split()
)
# Where labels are named: matchers {label="..."}, and by/without/on/ignoring (label, ...).
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
MATCHERS = re.compile(r"\{([^}]*)\}")
MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*')
STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
IDENTIFIER = re.compile(r"(?<![\w$.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(series, labels) an expression names: identifiers that are no function or keyword,
    and the label names of its matchers and groupings. Range and subquery durations
    ([5m], [$__rate_interval]) and Grafana's $variables are no names."""
    labels: set[str] = set()
    rest = STRINGS.sub('""', expr)  # a string may hold anything: {, }, commas
    for match in MATCHERS.finditer(rest):
        for matcher in filter(str.strip, match[1].split(",")):
            found = MATCHER.fullmatch(matcher)
            assert found, f"cannot read matcher {matcher!r} in {expr!r}"
            labels.add(found[1])
    rest = MATCHERS.sub(" ", rest)
    for match in GROUPING.finditer(rest):
        labels |= {label.strip() for label in match[2].split(",") if label.strip()}
    rest = GROUPING.sub(" ", rest)
    rest = re.sub(r"\[[^\]]*\]", " ", STRINGS.sub(" ", rest))
    series = {m[1] for m in IDENTIFIER.finditer(rest) if not m[2] and m[1] not in KEYWORDS}
    return series, labels


def _dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard: its panels' targets (rows' too) and its
    template variables' label_values(series, label) queries, as `series{label=""}`."""
    exprs = []
    panels = list(dashboard["panels"])
    while panels:
        panel = panels.pop()
        panels += panel.get("panels", [])
        exprs += [t["expr"] for t in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else ""
            found = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
            assert found, f"variable {variable['name']}: {query!r} is no label_values query"
            exprs.append(f'{found[1]}{{{found[2]}=""}}')
    return exprs


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def test_the_dashboard_is_valid_json_with_the_panels_operators_need(dashboard):
    titles = {p["title"] for p in dashboard["panels"]}
    wanted = {
        "Nodes by state",
        "Drained and down nodes by cause",
        "Jobs per partition and state",
        "Pending jobs by reason",
        "CPUs",
        "GPUs",
        "Failing health checks",
        "Node events over time",
        "Scheduler cycle",
    }
    assert wanted <= titles
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] == "slonk"


def test_the_dashboards_panels_do_not_overlap_and_read_the_chosen_data_source(dashboard):
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, panel["title"]
        for x in range(box["x"], box["x"] + box["w"]):
            for y in range(box["y"], box["y"] + box["h"]):
                assert (x, y) not in taken, f"{panel['title']} over {taken[x, y]}"
                taken[x, y] = panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_the_dashboard_names_only_series_and_labels_the_exporter_produces(dashboard):
    produced = exporter_series()
    named: set[str] = set()
    for expr in _dashboard_queries(dashboard):
        series, labels = promql_names(expr)
        unknown = series - set(produced)
        assert not unknown, f"{expr!r} names series the exporter does not produce: {unknown}"
        # Prometheus's own target labels are on every series.
        known = set().union(*(produced[s] for s in series)) | {"instance", "job"}
        assert labels <= known, f"{expr!r}: labels {labels - known} are on none of {series}"
        named |= series
    # Every family the issue asks the dashboard to show is on it.
    for family in ("slonk_nodes", "slonk_jobs_pending", "slonk_cpus", "slonk_gpus",
                   "slonk_health_check_ok", "slonk_node_events_total",
                   "slonk_scheduler_cycle_last_seconds", "slonk_gpu_temperature_celsius",
                   "slonk_gpu_ecc_corrected_errors_total"):  # fmt: skip
        assert family in named


@pytest.mark.parametrize(
    ("expr", "series", "labels"),
    [
        ('sum by (state) (slonk_nodes{pool=~"$pool", cause!="none"})', {"slonk_nodes"},
         {"state", "pool", "cause"}),
        ("topk(10, sum by (rpc) (rate(slonk_rpcs_total[$__rate_interval])))",
         {"slonk_rpcs_total"}, {"rpc"}),
        ("time() - min by (check) (a_b:c)", {"a_b:c"}, {"check"}),
        ('x{a="b,c}"} / on (n) group_left (m) y', {"x", "y"}, {"a", "n", "m"}),
        ("count(up == 0) or vector(0)", {"up"}, set()),
    ],
)  # fmt: skip
def test_promql_names(expr, series, labels):
    assert promql_names(expr) == (series, labels)


# ---------------------------------------------------------------------------------------
# Ports, Services, cluster.yaml.
def _ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def _spec(docs) -> dict[str, Any]:
    return yaml.safe_load(_get(docs, "ConfigMap", "slonk-cluster")["data"]["cluster.yaml"])


@pytest.mark.parametrize("port", [PORT, 9500])
def test_the_controller_and_every_worker_serve_metrics_on_the_named_port(port):
    docs = _docs({"metrics": {"port": port}, "nodepools": {"gpu": {"replicas": 2, "cpus": 8,
                  "memoryMiB": 1000, "gpus": {"count": 2}}}})  # fmt: skip
    for sts in ("slonk-controller", "slonk-cpu", "slonk-gpu"):
        (container,) = _get(docs, "StatefulSet", sts)["spec"]["template"]["spec"]["containers"]
        assert _ports(container)["metrics"] == port, sts
    ports = _get(docs, "Service", "slonk-controller")["spec"]["ports"]
    assert {"name": "metrics", "port": port, "targetPort": "metrics"} in ports
    for sts in ("slonk-login", "slonk-slurmdbd", "slonk-mariadb"):
        for container in _get(docs, "StatefulSet", sts)["spec"]["template"]["spec"]["containers"]:
            assert "metrics" not in _ports(container), sts
    spec = _spec(docs)
    assert spec["metrics"] == {"port": port}
    assert parse_spec(spec).metrics.port == port


def test_metrics_off_leaves_no_port_rule_or_spec_key():
    docs = _docs({"metrics": {"enabled": False, **ON["metrics"]}})
    for doc in docs:
        assert "metrics" not in json.dumps(doc.get("spec", {})).replace("slonk.io", ""), doc[
            "metadata"
        ]["name"]
    assert "metrics" not in _spec(docs)
    assert parse_spec(_spec(docs)).metrics is None
    assert not [d for d in docs if d["kind"] in ("PodMonitor", "ServiceMonitor")]
    # The dashboard is a ConfigMap for Grafana: it stays if asked (another release's data).
    assert _get(docs, "ConfigMap", "slonk-dashboard")


def test_anyone_may_scrape_by_default_and_only_that_port():
    docs = _docs()
    policies, pods = _policies(docs), _pods(docs)
    for source in (SCRAPER, OUTSIDE, STRANGER, pods["cpu"]):
        for target in ("controller", "cpu"):
            assert allowed(policies, source, pods[target], PORT), (source, target)
    # Users' shells keep their closed egress.
    assert not allowed(policies, pods["login"], pods["controller"], PORT)
    assert not allowed(policies, SCRAPER, pods["controller"], 6817)
    assert not allowed(policies, SCRAPER, pods["login"], PORT)


def test_metrics_from_restricts_the_scrapers():
    docs = _docs({"networkPolicy": {"metricsFrom": [MONITORING]}, "metrics": {"port": 9500}})
    policies, pods = _policies(docs), _pods(docs)
    for target in ("controller", "cpu"):
        assert allowed(policies, SCRAPER, pods[target], 9500)
        assert not allowed(policies, OUTSIDE, pods[target], 9500)
        assert not allowed(policies, STRANGER, pods[target], 9500)
        assert not allowed(policies, SCRAPER, pods[target], PORT)


# ---------------------------------------------------------------------------------------
# The PodMonitor and the dashboard's ConfigMap.
def test_the_pod_monitor_selects_the_controller_and_every_worker_by_their_metrics_port():
    docs = _docs(
        {"metrics": {"podMonitor": {"enabled": True, "interval": "15s",
                                    "labels": {"release": "kube-prometheus-stack"}}},
         "accounting": {"enabled": True}}
    )  # fmt: skip
    (monitor,) = [d for d in docs if d["kind"] == "PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"matchNames": ["hpc"]}
    endpoint = {"port": "metrics", "path": "/metrics", "interval": "15s"}
    assert spec["podMetricsEndpoints"] == [endpoint]
    pods = _pods(docs)
    chosen = {name for name, pod in pods.items() if selects(spec["selector"], pod.labels)}
    assert chosen == {"controller", "cpu"}, sorted(pods)
    for name in chosen:
        assert pods[name].ports["metrics"] == PORT
    assert {pods[name].labels[spec["jobLabel"]] for name in chosen} == {"controller", "worker"}
    # Nothing else in the release serves metrics.
    assert all("metrics" not in pod.ports for name, pod in pods.items() if name not in chosen)


@pytest.mark.parametrize("value", [{"enabled": True}, {"enabled": False}, {}])
def test_the_removed_service_monitor_key_is_refused_naming_its_successor(value):
    with pytest.raises(chart.ChartError) as caught:
        _docs({"metrics": {"serviceMonitor": value}})
    message = str(caught.value)
    assert "metrics.serviceMonitor: removed; " in message
    assert "metrics.podMonitor" in message and "podMonitorSelector" in message


def test_null_takes_the_removed_service_monitor_key_out():
    """A GitOps overlay over a base file that set it, or `--set metrics.serviceMonitor=null`."""
    docs = _docs({"metrics": {"serviceMonitor": None, "podMonitor": {"enabled": True}}})
    assert [d["kind"] for d in docs if d["kind"].endswith("Monitor")] == ["PodMonitor"]


def test_pod_monitor_and_dashboard_are_off_by_default():
    docs = _docs()
    assert not [d for d in docs if d["kind"] in ("PodMonitor", "ServiceMonitor")]
    assert not [d for d in docs if d["metadata"]["name"] == "slonk-dashboard"]


def test_the_dashboard_configmap_carries_the_file_and_the_sidecars_label(dashboard):
    docs = _docs({"metrics": {"dashboard": {"enabled": True}}})
    configmap = _get(docs, "ConfigMap", "slonk-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["slonk.json"]) == dashboard
    docs = _docs({"metrics": {"dashboard": {"enabled": True, "labels": {"dashboards": "hpc"}}}})
    labels = _get(docs, "ConfigMap", "slonk-dashboard")["metadata"]["labels"]
    # A map merges: the default label stays unless set to null.
    assert labels["dashboards"] == "hpc" and labels["grafana_dashboard"] == "1"


def test_the_dashboard_fits_a_configmap():
    rendered = chart.render(chart.default_chart(), ON)
    assert len(rendered["slonk/templates/metrics.yaml"].encode()) < 1 << 20


# ---------------------------------------------------------------------------------------
# Bad values: refused, naming the key.
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "metrics.port=0"], "at '/metrics/port': minimum: got 0, want 1"),
        (["--set", "metrics.port=65536"], "at '/metrics/port': maximum: got 65,536, want 65,535"),
        (["--set-string", "metrics.port=9341"], "at '/metrics/port': got string, want integer"),
        (["--set", "metrics.prot=1"], "at '/metrics': additional properties 'prot' not allowed"),
        (
            ["--set", "metrics.podMonitor.intervall=1m"],
            "at '/metrics/podMonitor': additional properties 'intervall' not allowed",
        ),
        (
            ["--set", "metrics.podMonitor.interval=soon"],
            "at '/metrics/podMonitor/interval'",
        ),
        (
            ["--set-string", "metrics.enabled=yes"],
            "at '/metrics/enabled': got string, want boolean",
        ),
        (["--set", "metrics.dashboard.labels.team=a b"], "at '/metrics/dashboard/labels/team'"),
        (["--set", "metrics.dashboard.labels.Bad_=1"], "invalid propertyName 'Bad_'"),
        (
            ["--set", "networkPolicy.metricsFrom[0].podSelectr.x=y"],
            "at '/networkPolicy/metricsFrom/0': additional properties 'podSelectr' not allowed",
        ),
        (
            ["--set", "metrics.port=6817"],
            "metrics.port: 6817 is slurmctldPort's port, in the same pods",
        ),
        (
            ["--set", "metrics.port=7000,slurm.slurmdPort=7000"],
            "metrics.port: 7000 is slurmdPort's port, in the same pods",
        ),
        (
            ["--set", "metrics.port=22,workers.ssh.enabled=false"],
            "metrics.port: 22 is sshd's port, in the same pods",
        ),
        (  # the chart's own labels select and own its objects: a site's may not repeat them
            [
                "--set",
                "metrics.podMonitor.enabled=true",
                "--set",
                "metrics.podMonitor.labels.app\\.kubernetes\\.io/instance=other",
            ],
            "metrics.podMonitor.labels: app.kubernetes.io/instance is set by the chart",
        ),
        (
            [
                "--set",
                "metrics.dashboard.enabled=true",
                "--set",
                "metrics.dashboard.labels.app\\.kubernetes\\.io/name=x",
            ],
            "metrics.dashboard.labels: app.kubernetes.io/name is set by the chart",
        ),
    ],
)
def test_bad_metrics_values_fail_naming_the_key(args, message):
    assert message in _template_error(*args)
