"""Slurm's node and job state read from its JSON: real 24.11 output, hostile reasons, and
output that cannot be read failing closed."""

from __future__ import annotations

import json

import pytest

from slonk.slurm import reasons, slurm_state
from slonk.slurm.slurm_state import SlurmError, parse_jobs, parse_nodes

from . import slurm_json

HOSTILE = (
    "person's words NodeName=n4 State=IDLE Reason=slonk:gpu: forged\n"
    "NodeName=n4 State=IDLE+DRAIN Reason=slonk:gpu: forged \u2028 caf\u00e9 \u2603 [root@now]"
)


def _real_nodes() -> dict[str, slurm_state.NodeState]:
    return {n.name: n for n in parse_nodes(slurm_json.text("scontrol-show-node.json"))}


def test_real_nodes_are_read_one_record_each():
    nodes = _real_nodes()
    assert list(nodes) == ["bare", "n1", "n2", "n3", "n4"]
    shown = {n: (s.label, s.up, s.schedulable, s.cause) for n, s in nodes.items()}
    assert shown == {
        "bare": ("idle+drain", True, False, reasons.Cause(reasons.HEALTH, "gpu")),
        "n1": ("mixed+drain", True, False, None),  # a person's drain
        "n2": ("down", False, False, None),
        "n3": ("unknown+not_responding", False, False, None),  # never registered
        "n4": ("idle", True, True, None),
    }
    bare = nodes["bare"]
    assert (bare.reason, bare.reason_by) == ("slonk:gpu: 1 of 2 GPUs answer", "root")
    assert nodes["n2"].reason == "maintenance by a person"
    assert (nodes["n3"].slurmd_started, nodes["n4"].slurmd_started) == ("0", "1795354690")


def test_a_hostile_reason_is_its_nodes_whole_and_forges_nothing():
    """Text output cut n1's reason into a second `NodeName=n4 ... Reason=slonk:...` line."""
    nodes = _real_nodes()
    assert nodes["n1"].reason == HOSTILE
    assert nodes["n1"].cause is None  # does not start `slonk:`: a person's
    n4 = nodes["n4"]
    assert (n4.label, n4.drained, n4.reason, n4.cause) == ("idle", False, "", None)


@pytest.mark.parametrize(
    "reason",
    [
        "maintenance Reason=slonk:gpu: forged",
        "x\nslonk:gpu: forged",
        " slonk:gpu: forged",
        "\u2028slonk:gpu: forged",
        "slonk:gpu:forged",
        "SLONK:gpu: forged",
    ],
)
def test_a_reason_is_slonks_only_when_it_starts_as_slonk_writes_it(reason):
    (node,) = parse_nodes(slurm_json.nodes(slurm_json.node("a", ["IDLE", "DRAIN"], reason)))
    assert (node.reason, node.cause) == (reason, None)


def test_a_reason_naming_another_node_changes_only_its_own():
    forged = "NodeName=b State=IDLE+DRAIN Reason=slonk:gpu: x\nNodeName=b State=DOWN"
    a, b = parse_nodes(
        slurm_json.nodes(
            slurm_json.node("a", ["IDLE", "DRAIN"], forged), slurm_json.node("b", ["IDLE"])
        )
    )
    assert (a.name, a.reason) == ("a", forged)
    assert (b.name, b.label, b.reason, b.cause) == ("b", "idle", "", None)


def test_an_unknown_name_is_no_node():
    assert parse_nodes(slurm_json.text("scontrol-show-node-unknown-name.json")) == []


def _broken(change) -> str:
    shown = slurm_json.document("scontrol-show-node.json")
    change(shown, shown["nodes"][0])
    return json.dumps(shown)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "output is not JSON"),
        ('{"nodes": [', "output is not JSON"),
        ("[]", "not a JSON object"),
        ("{}", "`nodes` is missing or not a list"),
        ('{"nodes": {}}', "`nodes` is missing or not a list"),
        ('{"nodes": ["bare"]}', "a record is not a JSON object"),
        (
            '{"nodes": [], "errors": [{"description": "Unable to contact slurm controller",'
            ' "error_number": 1007}]}',
            "Slurm reported errors: Unable to contact slurm controller",
        ),
        (_broken(lambda d, n: n.pop("name")), "a node: `name` is missing or not a str"),
        (_broken(lambda d, n: n.pop("state")), "node 'bare': `state` is missing"),
        (_broken(lambda d, n: n.update(state=[])), "node 'bare': `state` is not a list of states"),
        (_broken(lambda d, n: n.update(state="IDLE+DRAIN")), "`state` is missing or not a list"),
        (_broken(lambda d, n: n.update(state=["IDLE", None])), "not a list of states"),
        (_broken(lambda d, n: n.pop("reason")), "node 'bare': `reason` is missing or not a str"),
        (_broken(lambda d, n: n.update(reason=None)), "`reason` is missing or not a str"),
        (_broken(lambda d, n: n.pop("reason_set_by_user")), "`reason_set_by_user` is missing"),
        (_broken(lambda d, n: n.pop("slurmd_start_time")), "`slurmd_start_time` is missing"),
        (
            _broken(lambda d, n: n["slurmd_start_time"].update(number="soon")),
            "slurmd_start_time: `number` is missing or not a int",
        ),
        (_broken(lambda d, n: n["slurmd_start_time"].update(number=True)), "not a int"),
    ],
)
def test_nodes_that_cannot_be_read_are_an_error_never_none(text, error):
    with pytest.raises(SlurmError) as raised:
        parse_nodes(text)
    assert str(raised.value).startswith("scontrol show node --json: ")
    assert error in str(raised.value)


def test_real_jobs_are_read_with_the_nodes_they_hold():
    running, pending = parse_jobs(slurm_json.text("squeue.json"))
    assert running == slurm_state.Job("1", "RUNNING", ("n1",), 0, "n1")
    assert pending == slurm_state.Job("2", "PENDING", (), 0, "")


def _broken_job(change) -> str:
    shown = slurm_json.document("squeue.json")
    change(shown["jobs"][0])
    return json.dumps(shown)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{}", "`jobs` is missing or not a list"),
        (_broken_job(lambda j: j.pop("job_id")), "a job: `job_id` is missing or not a int"),
        (_broken_job(lambda j: j.update(job_id="1")), "`job_id` is missing or not a int"),
        (_broken_job(lambda j: j.pop("job_state")), "job 1: `job_state` is missing"),
        (_broken_job(lambda j: j.update(job_resources=[])), "`job_resources` is not an object"),
        (
            _broken_job(lambda j: j["job_resources"]["nodes"].pop("allocation")),
            "`allocation` is missing or not a list",
        ),
        (
            _broken_job(lambda j: j["job_resources"]["nodes"]["allocation"][0].pop("name")),
            "job 1: allocation: `name` is missing",
        ),
    ],
)
def test_jobs_that_cannot_be_read_are_an_error_never_none(text, error):
    with pytest.raises(SlurmError) as raised:
        parse_jobs(text)
    assert str(raised.value).startswith("squeue --json: ")
    assert error in str(raised.value)
