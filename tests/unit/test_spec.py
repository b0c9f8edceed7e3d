"""The cluster spec: what it accepts, and errors that name the offending key."""

from __future__ import annotations

import pytest
import yaml

from slonk.config import render
from slonk.config.spec import SpecError, load_spec, parse_spec


def test_demo_spec_parses(demo_spec):
    spec = parse_spec(demo_spec)
    assert [p.name for p in spec.nodepools] == ["cpu", "gpu"]
    assert spec.pool("gpu").gpus.count == 8
    assert spec.node_names()[:3] == ["slonk-cpu-0", "slonk-cpu-1", "slonk-gpu-0"]
    assert spec.controller_names == ("slonk-controller-0",)
    assert spec.controller_addresses == ("slonk-controller.hpc.svc.cluster.local",)


def test_pool_of_maps_node_names_to_pools(demo_spec):
    spec = parse_spec(demo_spec)
    assert spec.pool_of("slonk-gpu-3").name == "gpu"
    assert spec.pool_of("slonk-gpu-4") is None  # past the pool's replicas
    assert spec.pool_of("slonk-controller-0") is None


def _error(data) -> str:
    with pytest.raises(SpecError) as caught:
        parse_spec(data)
    return str(caught.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: s["partitions"]["gpu"]["pools"].append("tpu"),
            "partitions.gpu.pools[1]: unknown nodepool 'tpu'",
        ),
        (
            lambda s: s["nodepools"].update(CPU_pool=s["nodepools"].pop("cpu")),
            "nodepools.CPU_pool: 'CPU_pool' is not a DNS-1123 label",
        ),
        (
            lambda s: s["nodepools"].update({"x" * 60: s["nodepools"].pop("cpu")}),
            f"nodepools.{'x' * 60}: StatefulSet name 'slonk-xxx",
        ),
        (
            lambda s: s["nodepools"]["gpu"].update(gpus={"type": "h100"}),
            "nodepools.gpu.gpus.count: GPUs declared without a count",
        ),
        (
            lambda s: s["nodepools"]["gpu"].update(gpus={"count": 0}),
            "nodepools.gpu.gpus.count: must be >= 1, got 0",
        ),
        (
            lambda s: s["nodepools"]["cpu"].update(replicas=-1),
            "nodepools.cpu.replicas: must be >= 0, got -1",
        ),
        (
            lambda s: s["nodepools"]["cpu"].update(replicas="2"),
            "nodepools.cpu.replicas: expected an integer, got str",
        ),
        (
            lambda s: s["nodepools"]["cpu"].update(replicas=True),
            "nodepools.cpu.replicas: expected an integer, got a boolean",
        ),
        (lambda s: s["nodepools"]["cpu"].update(replica=2), "nodepools.cpu.replica: unknown key"),
        (lambda s: s["nodepools"]["cpu"].update(name="cpu"), "nodepools.cpu.name: unknown key"),
        (lambda s: s["nodepools"]["cpu"].pop("cpus"), "nodepools.cpu.cpus: required"),
        (
            lambda s: s["nodepools"].update(login=s["nodepools"].pop("cpu")),
            "nodepools.login: 'login' is reserved",
        ),
        (lambda s: s["nodepools"].update(cpu=None), "nodepools.cpu: expected a mapping, got null"),
        (
            lambda s: (
                s["partitions"]["main"].update(default=True)
                or s["partitions"]["gpu"].update(default=True)
            ),
            "partitions.main.default: only one partition can be the default (gpu is)",
        ),
        (
            lambda s: s.update(nodepools=[{"name": "cpu", "replicas": 2}]),
            "nodepools: a list, the form before chart 0.4.0; write a map keyed by name instead: "
            'nodepools: {"cpu":{"replicas":2}}',
        ),
        (
            lambda s: s.update(partitions=[{"name": "main", "pools": ["cpu"]}]),
            "partitions: a list, the form before chart 0.4.0; write a map keyed by name instead: "
            'partitions: {"main":{"pools":["cpu"]}}',
        ),
        (
            lambda s: s.update(extraLines=["SchedulerType sched/backfill"]),
            "extraLines[0]: 'SchedulerType sched/backfill' is not one 'Key=Value' slurm.conf",
        ),
        (
            lambda s: s.update(extraLines=["nodename=extra"]),
            "extraLines[0]: nodename is set by slonk from the spec",
        ),
        (
            lambda s: s.update(extraLines=["A=1\nB=2"]),
            "extraLines[0]: 'A=1\\nB=2' holds a control character",
        ),
        (
            lambda s: s.update(slurmConf={"ClusterName": "other"}),
            "slurmConf.ClusterName: set by slonk from the spec",
        ),
        (
            lambda s: s.update(slurmConf={"Bad Key": "x"}),
            "slurmConf.Bad Key: not a Slurm setting name",
        ),
        (
            lambda s: s.update(slurmConf={"SchedulerParameters": ["a"]}),
            "slurmConf.SchedulerParameters: expected a scalar or null, got list",
        ),
        (
            lambda s: s.update(clusterName="My Cluster"),
            "clusterName: 'My Cluster' must be lowercase",
        ),
        (lambda s: s.update(confinement="docker"), "confinement: must be one of cgroup, none"),
        (lambda s: s.update(version=2), "version: unsupported spec version 2"),
        (
            lambda s: s.update(users=[{"name": "Bob", "uid": 1, "gid": 1}]),
            "users[0].name: 'Bob' is not a valid user name",
        ),
        (
            lambda s: s.update(
                users=[
                    {
                        "name": "bob",
                        "uid": 2000,
                        "gid": 2000,
                        "shell": "/bin/sh\nroot::0:0::/:/bin/sh",
                    }
                ]
            ),
            "users[0].shell: '/bin/sh\\nroot::0:0::/:/bin/sh' holds a control character",
        ),
        (lambda s: s.update(accounts={"minUid": 5}), "accounts.minUid: unknown key"),
        (
            lambda s: s.update(
                ldap={"uris": ["ldap://x"], "userBase": "a", "groupBase": "b", "minUid": 1000}
            ),
            "ldap.minUid: unknown key",
        ),
        (
            lambda s: s.update(ldapServer={"suffix": "dc=x\nuserPassword: x"}),
            "ldapServer.suffix: 'dc=x\\nuserPassword: x' holds a control character",
        ),
        (
            lambda s: s.update(
                ldapServer={"suffix": "dc=x", "users": [{"name": "eve", "uid": 0, "gid": 2000}]}
            ),
            "ldapServer.users[0].uid: uid 0 is outside 1000-60000",
        ),
        (
            lambda s: s.update(capacity={"returnOnDemand": "yes"}),
            "capacity.returnOnDemand: expected a boolean, got str",
        ),
        (lambda s: s.update(capacity={"onDemand": True}), "capacity.onDemand: unknown key"),
        (
            lambda s: s.update(accounting={"database": {"host": "db"}}),
            "accounting.host: required",
        ),
        (
            lambda s: s.update(accounting={"host": "dbd", "database": {}}),
            "accounting.database.host: required",
        ),
        (
            lambda s: s.update(
                accounting={
                    "host": "dbd",
                    "database": {"host": "db"},
                    "groupAccounts": [
                        {"group": "physics", "account": "a"},
                        {"group": "physics", "account": "b"},
                    ],
                }
            ),
            "accounting.groupAccounts[1].group: duplicate group 'physics'",
        ),
        (
            lambda s: s.update(
                accounting={"host": "dbd", "database": {"host": "db"}, "defaultAccount": "Root"}
            ),
            "accounting.defaultAccount: 'Root' is not a Slurm account",
        ),
        (
            lambda s: s.update(priority={"weights": {"fairShare": 1}}),
            "priority.weights.fairShare: unknown key",
        ),
    ],
)
def test_invalid_specs_name_the_key(demo_spec, change, message):
    change(demo_spec)
    assert message in _error(demo_spec)


def test_accounting_keys_not_given_take_their_defaults(demo_spec):
    demo_spec["accounting"] = {"host": "dbd", "database": {"host": "db"}}
    accounting = parse_spec(demo_spec).accounting
    assert accounting is not None
    assert (accounting.port, accounting.default_account, accounting.group_accounts) == (
        6819,
        "research",
        (),
    )
    database = accounting.database
    assert (database.port, database.name, database.user, database.tls) == (
        3306,
        "slurm_acct_db",
        "slurm",
        False,
    )


def test_capacity_returns_on_demand_only_when_asked(demo_spec):
    assert parse_spec(demo_spec).capacity.return_on_demand is False
    demo_spec["capacity"] = {"returnOnDemand": True}
    assert parse_spec(demo_spec).capacity.return_on_demand is True


def test_not_a_mapping():
    assert _error(["a"]) == "<root>: expected a mapping, got list"


def test_load_spec_names_the_file(tmp_path, demo_spec):
    path = tmp_path / "cluster.yaml"
    demo_spec["nodepools"]["cpu"]["replicas"] = -3
    path.write_text(yaml.safe_dump(demo_spec))
    with pytest.raises(SpecError, match=r"cluster.yaml: nodepools.cpu.replicas: must be >= 0"):
        load_spec(path)
    path.write_text("nodepools: [unclosed")
    with pytest.raises(SpecError, match=r"cluster\.yaml: not valid YAML"):
        load_spec(path)
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")


def test_extra_lines_keep_comments_and_settings(demo_spec):
    demo_spec["extraLines"] = ["# tuned for pods", "  MaxJobCount=50000  ", ""]
    spec = parse_spec(demo_spec)
    assert spec.extra_lines == ("# tuned for pods", "")
    assert spec.slurm_conf["MaxJobCount"] == "50000"  # a setting like slurmConf's: never twice


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"slurmConf": {"SrunPortRange": "1-2"}, "extraLines": ["srunportrange=3-4"]},
            "extraLines[0]: srunportrange is set by slurmConf.SrunPortRange already",
        ),
        (
            {"extraLines": ["Prolog=/a", "PROLOG=/b"]},
            "extraLines[1]: PROLOG is set by extraLines[0] already",
        ),
        (
            {"slurmConf": {"SlurmctldAddr": "evil.example.org"}},
            "slurmConf.SlurmctldAddr: set by slonk",
        ),
        (
            {"partitions": {"Default": {"pools": ["cpu"]}}},
            "partitions.Default: 'Default' is Slurm's keyword",
        ),
        (
            {"partitions": {"p": {"pools": ["cpu"], "options": {"priority": 9}}}},
            "partitions.p.options.priority: set by slonk",
        ),
        (
            {"partitions": {"p": {"pools": ["cpu"], "priorityTier": 70000}}},
            "partitions.p.priorityTier: must be <= 65535",
        ),
        (
            {"nodepools": {"cpu": {"replicas": 1, "cpus": 70000, "memoryMiB": 1}}},
            "nodepools.cpu.cpus: must be <= 65535",
        ),
        (
            {"nodepools": {"cpu": {"replicas": 1, "cpus": 10**20, "memoryMiB": 1}}},
            "nodepools.cpu.cpus: 100000000000000000000 is beyond 2147483647",
        ),
        (
            {"health": {"enabled": True, "intervalSeconds": float("inf")}},
            "health.intervalSeconds: inf is beyond 2147483647",
        ),
        (
            {"health": {"enabled": True, "checks": {"storage": {"timeoutSeconds": 30}}}},
            "health.checks.storage.timeoutSeconds: must be > 0 and at most 20 (Slurm kills",
        ),
    ],
)
def test_settings_are_written_once_and_within_slurms_ranges(demo_spec, change, message):
    demo_spec.update(change)
    assert _error(demo_spec).startswith(message)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # A billion laughs: every reader of the parsed document would walk 2^N nodes.
        ("a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n", "YAML aliases are not allowed here"),
        # libyaml recurses in C on this and kills the process; it must be a clean refusal.
        ("[" * 100_000 + "]" * 100_000, "nested too deeply to be a cluster spec"),
        # A complex key is no name: refused, not a TypeError that ends config-watch.
        ("? [a, b]\n: 1\n", "found unhashable key"),
        ("nodepools: {? {a: 1} : 1}\n", "found unhashable key"),
        ("clusterName: a\nrelease: r\nnodepools: {123: {}}\n", "nodepools.123: expected a name"),
        ("clusterName: a\nrelease: r\npartitions: {true: {}}\n", "partitions.True: expected a"),
        (f"clusterName: a\nrelease: {'r' * 42}\n", f"release: '{'r' * 42}' is longer than 41"),
    ],
    ids=["aliases", "deep", "list-key", "map-key", "number-name", "bool-name", "long-release"],
)
def test_hostile_yaml_is_refused_with_a_spec_error(tmp_path, text, message):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=message):
        load_spec(path)


def test_a_control_character_in_a_key_is_refused(demo_spec):
    demo_spec["slurmConf"] = {"MaxJobCount\nNodeName": 1}
    assert _error(demo_spec).startswith("slurmConf.MaxJobCount\nNodeName: ")


def _block_spec(demo_spec, *pools):
    """Block topology over pools given as (replicas, block or None)."""
    demo_spec["topology"] = "block"
    demo_spec["nodepools"] = {
        f"p{i}": {
            "replicas": replicas,
            "cpus": 1,
            "memoryMiB": 100,
            **({"topology": {"block": block}} if block else {}),
        }
        for i, (replicas, block) in enumerate(pools)
    }
    demo_spec["partitions"] = {"main": {"pools": ["p0"], "default": True}}
    return demo_spec


@pytest.mark.parametrize(
    ("pools", "blocks"),
    [
        ([(2, "b1"), (2, "b2")], ["b1 Nodes=slonk-p0-[0-1]", "b2 Nodes=slonk-p1-[0-1]"]),
        (
            [(4, "b1"), (2, "b2"), (3, "b3")],
            ["b2 Nodes=slonk-p1-[0-1]", "b3 Nodes=slonk-p2-[0-2]", "b1 Nodes=slonk-p0-[0-3]"],
        ),
        # pools sharing a block add up; a pool without a block is a block of its own
        ([(1, "b1"), (1, "b1"), (1, None)], ["p2 Nodes=slonk-p2-0", "b1 Nodes=slonk-p[0-1]-0"]),
        ([(2, "b1"), (0, "b2"), (2, None)], ["b1 Nodes=slonk-p0-[0-1]", "p2 Nodes=slonk-p2-[0-1]"]),
    ],
)
def test_blocks_are_written_smallest_first(demo_spec, pools, blocks):
    """slurmctld takes the first block's node count as the base block size and refuses to
    start on a smaller block after it (Slurm's topology/block block_record.c, measured on
    24.11): smallest first (then by name), any block sizes are valid, in any pool order."""
    lines = render.topology_lines(parse_spec(_block_spec(demo_spec, *pools)))
    assert lines == [f"BlockName={block}" for block in blocks]


def test_a_key_given_twice_is_refused(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("clusterName: a\nrelease: r\nnodepools:\n  cpu: {}\n  cpu: {}\n")
    with pytest.raises(SpecError, match="line 5: key 'cpu' given twice"):
        load_spec(path)
