"""The cluster spec: what it accepts, and errors that name the offending key."""

from __future__ import annotations

import pytest
import yaml

from slonk.config.spec import SpecError, load_spec, parse_spec


def test_demo_spec_parses(demo_spec):
    spec = parse_spec(demo_spec)
    assert [p.name for p in spec.nodepools] == ["cpu", "gpu"]
    assert spec.pool("gpu").gpus.count == 8
    assert spec.node_names()[:3] == ["slonk-cpu-0", "slonk-cpu-1", "slonk-gpu-0"]
    assert spec.controller_name == "slonk-controller-0"
    assert spec.controller_address == "slonk-controller.hpc.svc.cluster.local"


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
        (lambda s: s["nodepools"].append(dict(s["nodepools"][0])),
         "nodepools[2].name: duplicate nodepool 'cpu'"),
        (lambda s: s["partitions"][1]["pools"].append("tpu"),
         "partitions[1].pools[1]: unknown nodepool 'tpu'"),
        (lambda s: s["nodepools"][0].update(name="CPU_pool"),
         "nodepools[0].name: 'CPU_pool' is not a DNS-1123 label"),
        (lambda s: s["nodepools"][0].update(name="x" * 60),
         "nodepools[0].name: node name 'slonk-xxx"),
        (lambda s: s["nodepools"][1].update(gpus={"type": "h100"}),
         "nodepools[1].gpus.count: GPUs declared without a count"),
        (lambda s: s["nodepools"][1].update(gpus={"count": 0}),
         "nodepools[1].gpus.count: must be >= 1, got 0"),
        (lambda s: s["nodepools"][0].update(replicas=-1),
         "nodepools[0].replicas: must be >= 0, got -1"),
        (lambda s: s["nodepools"][0].update(replicas="2"),
         "nodepools[0].replicas: expected an integer, got str"),
        (lambda s: s["nodepools"][0].update(replicas=True),
         "nodepools[0].replicas: expected an integer, got a boolean"),
        (lambda s: s["nodepools"][0].update(replica=2),
         "nodepools[0].replica: unknown key"),
        (lambda s: s["nodepools"][0].pop("cpus"),
         "nodepools[0].cpus: required"),
        (lambda s: s["nodepools"][0].update(name="login"),
         "nodepools[0].name: 'login' is reserved"),
        (lambda s: s["partitions"].append({"name": "main", "pools": []}),
         "partitions[2].name: duplicate partition 'main'"),
        (lambda s: s["partitions"][1].update(default=True),
         "partitions[1].default: only one partition can be the default"),
        (lambda s: s.update(extraLines=["SchedulerType sched/backfill"]),
         "extraLines[0]: 'SchedulerType sched/backfill' is not one 'Key=Value' slurm.conf"),
        (lambda s: s.update(extraLines=["nodename=extra"]),
         "extraLines[0]: nodename is set by slonk from the spec"),
        (lambda s: s.update(extraLines=["A=1\nB=2"]),
         "extraLines[0]: 'A=1\\nB=2' holds a control character"),
        (lambda s: s.update(slurmConf={"ClusterName": "other"}),
         "slurmConf.ClusterName: set by slonk from the spec"),
        (lambda s: s.update(slurmConf={"Bad Key": "x"}),
         "slurmConf.Bad Key: not a Slurm setting name"),
        (lambda s: s.update(slurmConf={"SchedulerParameters": ["a"]}),
         "slurmConf.SchedulerParameters: expected a scalar or null, got list"),
        (lambda s: s.update(clusterName="My Cluster"),
         "clusterName: 'My Cluster' must be lowercase"),
        (lambda s: s.update(confinement="docker"),
         "confinement: must be one of cgroup, none"),
        (lambda s: s.update(version=2),
         "version: unsupported spec version 2"),
        (lambda s: s.update(users=[{"name": "Bob", "uid": 1, "gid": 1}]),
         "users[0].name: 'Bob' is not a valid user name"),
        (lambda s: s.update(users=[{"name": "bob", "uid": 2000, "gid": 2000,
                                    "shell": "/bin/sh\nroot::0:0::/:/bin/sh"}]),
         "users[0].shell: '/bin/sh\\nroot::0:0::/:/bin/sh' holds a control character"),
        (lambda s: s.update(accounts={"minUid": 5}),
         "accounts.minUid: unknown key"),
        (lambda s: s.update(ldap={"uris": ["ldap://x"], "userBase": "a", "groupBase": "b",
                                  "minUid": 1000}),
         "ldap.minUid: unknown key"),
        (lambda s: s.update(ldapServer={"suffix": "dc=x\nuserPassword: x"}),
         "ldapServer.suffix: 'dc=x\\nuserPassword: x' holds a control character"),
        (lambda s: s.update(ldapServer={"suffix": "dc=x", "users": [
            {"name": "eve", "uid": 0, "gid": 2000}]}),
         "ldapServer.users[0].uid: uid 0 is outside 1000-60000"),
    ],
)
def test_invalid_specs_name_the_key(demo_spec, change, message):
    change(demo_spec)
    assert message in _error(demo_spec)


def test_not_a_mapping():
    assert _error(["a"]) == "<root>: expected a mapping, got list"


def test_load_spec_names_the_file(tmp_path, demo_spec):
    path = tmp_path / "cluster.yaml"
    demo_spec["nodepools"][0]["replicas"] = -3
    path.write_text(yaml.safe_dump(demo_spec))
    with pytest.raises(SpecError, match=r"cluster.yaml: nodepools\[0\].replicas: must be >= 0"):
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
        ({"slurmConf": {"SrunPortRange": "1-2"}, "extraLines": ["srunportrange=3-4"]},
         "extraLines[0]: srunportrange is set by slurmConf.SrunPortRange already"),
        ({"extraLines": ["Prolog=/a", "PROLOG=/b"]},
         "extraLines[1]: PROLOG is set by extraLines[0] already"),
        ({"slurmConf": {"SlurmctldAddr": "evil.example.org"}},
         "slurmConf.SlurmctldAddr: set by slonk"),
        ({"partitions": [{"name": "Default", "pools": ["cpu"]}]},
         "partitions[0].name: 'Default' is Slurm's keyword"),
        ({"partitions": [{"name": "p", "pools": ["cpu"], "options": {"priority": 9}}]},
         "partitions[0].options.priority: set by slonk"),
        ({"partitions": [{"name": "p", "pools": ["cpu"], "priorityTier": 70000}]},
         "partitions[0].priorityTier: must be <= 65535"),
        ({"nodepools": [{"name": "cpu", "replicas": 1, "cpus": 70000, "memoryMiB": 1}]},
         "nodepools[0].cpus: must be <= 65535"),
        ({"nodepools": [{"name": "cpu", "replicas": 1, "cpus": 10**20, "memoryMiB": 1}]},
         "nodepools[0].cpus: 100000000000000000000 is beyond 2147483647"),
        ({"health": {"enabled": True, "intervalSeconds": float("inf")}},
         "health.intervalSeconds: inf is beyond 2147483647"),
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
    ],
    ids=["aliases", "deep"],
)
def test_hostile_yaml_is_refused_not_expanded(tmp_path, text, message):
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
    demo_spec["nodepools"] = [
        {"name": f"p{i}", "replicas": replicas, "cpus": 1, "memoryMiB": 100,
         **({"topology": {"block": block}} if block else {})}
        for i, (replicas, block) in enumerate(pools)]
    demo_spec["partitions"] = [{"name": "main", "pools": ["p0"], "default": True}]
    return demo_spec


@pytest.mark.parametrize("pools", [
    [(2, "b1"), (2, "b2")],
    [(2, "b1"), (4, "b2"), (3, "b3")],  # larger blocks are fine (measured on 24.11)
    [(1, "b1"), (1, "b1"), (2, "b2")],  # pools sharing a block add up
    [(2, "b1"), (1, "b2"), (1, "b2")],
    [(2, "b1"), (0, "b2"), (2, None)],  # a pool without nodes is in no block
    [(3, "b1")],
])
def test_blocks_at_least_as_large_as_the_first_are_accepted(demo_spec, pools):
    parse_spec(_block_spec(demo_spec, *pools))


@pytest.mark.parametrize(("pools", "message"), [
    ([(4, "b1"), (2, "b2")], "nodepools[1].replicas: block 'b2' has 2 node(s), fewer than "
     "the first block 'b1' (4): Slurm takes the first block's size as the base block size"),
    ([(2, "b1"), (1, None)], "nodepools[1].replicas: block 'p1' has 1 node(s), fewer than "
     "the first block 'b1' (2)"),  # an unplaced pool is a block of its own
])
def test_a_block_smaller_than_the_first_is_refused(demo_spec, pools, message):
    with pytest.raises(SpecError) as caught:
        parse_spec(_block_spec(demo_spec, *pools))
    assert str(caught.value).startswith(message)


def test_block_sizes_matter_only_under_block_topology(demo_spec):
    spec = _block_spec(demo_spec, (4, "b1"), (2, "b2"))
    spec["topology"] = "tree"
    parse_spec(spec)
