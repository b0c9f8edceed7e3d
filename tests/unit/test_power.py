"""slonk.slurm.power on Slurm 24.11's own JSON (data/scontrol-show-node-power.json, captured while
lending a node) and on the requests file slurmctld's ResumeProgram writes from untrusted text.
Real Slurm runs the whole sequence in tests/integration/test_local_power.py."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from slonk.base import paths
from slonk.slurm import power, slurm_nodes
from slonk.slurm.slurm_state import parse_nodes

from .slurm_json import node, nodes, text

CAPTURED = {n.name: n for n in parse_nodes(text("scontrol-show-node-power.json"))}


@pytest.mark.parametrize(
    ("name", "up", "powered_down", "powering_down", "powering_up", "lent", "lent_on_demand"),
    [
        ("asked", True, False, True, False, False, False),  # IDLE+DRAIN+POWER_DOWN
        ("going", False, False, True, False, False, False),  # IDLE+POWERING_DOWN
        ("lent", False, True, False, False, True, True),  # IDLE+DRAIN+POWERED_DOWN
        ("on-demand", False, True, False, False, False, True),  # IDLE+POWERED_DOWN
        ("waking", False, False, False, True, False, False),  # MIXED+NOT_RESPONDING+POWERING_UP
    ],
)
def test_power_states_as_slurm_reports_them(
    name, up, powered_down, powering_down, powering_up, lent, lent_on_demand
):
    found = CAPTURED[name]
    assert found.state in ("idle", "mixed")  # Slurm keeps the base state through power saving
    assert (found.up, found.powered_down, found.powering_down, found.powering_up) == (
        up,
        powered_down,
        powering_down,
        powering_up,
    )
    assert power.is_lent(found) is lent
    assert power.is_lent(found, on_demand=True) is lent_on_demand
    assert not found.schedulable


def test_the_lent_reason_is_one_line_of_the_syncers_kind():
    reason = power.lent_reason("scaled to 1\nby slonk-pool\u2028x")
    assert reason == "slonk:k8s:lent: scaled to 1 by slonk-pool x"
    assert power.is_lent_reason(reason)
    assert CAPTURED["lent"].reason == power.lent_reason("scaled to 1")
    assert not power.is_lent_reason("slonk:k8s:lent-ish: x")
    assert not power.is_lent_reason("maintenance slonk:k8s:lent: x")


class FakeScontrol:
    """Slurm's answers, one node's state after each change slonk asks for; records the
    changes. Stands for the scontrol binary only: the JSON is Slurm's own."""

    def __init__(self, *states: tuple[list[str], str]) -> None:
        self.states = list(states)
        self.changes: list[tuple[str, ...]] = []

    def __call__(self, *args: str) -> str:
        if args[:2] == ("show", "node"):
            state, reason = self.states[0]
            return nodes(node("n", state, reason))
        self.changes.append(args[2:])
        if len(self.states) > 1:
            self.states.pop(0)
        return ""


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setattr(paths, "POWERED_DOWN_REASONS", tmp_path / "reasons.json")

    def install(*states: tuple[list[str], str]) -> FakeScontrol:
        fake = FakeScontrol(*states)
        monkeypatch.setattr(slurm_nodes, "scontrol", fake)
        monkeypatch.setattr(power, "POLL_SECONDS", 0)
        return fake

    return install


LENT = "slonk:k8s:lent: scaled"


def test_lend_drains_and_waits_for_the_pod(slurm):
    fake = slurm((["IDLE"], ""), (["IDLE", "DRAIN"], LENT))
    assert power.lend("n", "scaled", pod_gone=False) is False
    assert fake.changes == [("state=drain", f"reason={LENT}")]


def test_lend_waits_for_jobs_to_end(slurm):
    fake = slurm((["MIXED", "DRAIN"], LENT))
    assert power.lend("n", "scaled", pod_gone=True) is False
    assert fake.changes == []


def test_lend_powers_down_then_drains_again(slurm):
    fake = slurm(
        (["IDLE", "DRAIN"], LENT),
        (["IDLE", "POWERING_DOWN"], LENT),  # Slurm cleared the drain, kept the reason
        (["IDLE", "DRAIN", "POWERED_DOWN"], LENT),
    )
    assert power.lend("n", "scaled", pod_gone=True) is True
    assert fake.changes == [("state=power_down",), ("state=drain", f"reason={LENT}")]


def test_lend_on_demand_leaves_the_node_undrained(slurm):
    fake = slurm((["IDLE", "DRAIN"], LENT), (["IDLE", "POWERED_DOWN"], LENT))
    assert power.lend("n", "scaled", pod_gone=True, on_demand=True) is True
    assert fake.changes == [("state=power_down",)]


def test_a_persons_drain_outlives_the_power_down(slurm):
    fake = slurm(
        (["IDLE", "DRAIN"], "bad fan"),
        (["IDLE", "POWERING_DOWN"], "bad fan"),
        (["IDLE", "DRAIN", "POWERED_DOWN"], "bad fan"),
    )
    assert power.lend("n", "scaled", pod_gone=True, on_demand=True) is True
    assert fake.changes == [("state=power_down",), ("state=drain", "reason=bad fan")]


def test_a_pod_that_stopped_undrained_is_lent_not_down(slurm):
    fake = slurm((["DOWN"], "slonk:pod: stopping"), (["IDLE", "NOT_RESPONDING"], ""))
    power.lend("n", "scaled", pod_gone=True)
    assert fake.changes[:2] == [("state=resume",), ("state=drain", f"reason={LENT}")]


def test_nothing_is_done_to_a_node_slurm_powers_up_for_a_job(slurm):
    fake = slurm((["MIXED", "NOT_RESPONDING", "POWERING_UP"], ""))
    assert power.lend("n", "scaled", pod_gone=True) is False
    assert power.give_back("n") is False
    assert fake.changes == []


@pytest.mark.parametrize(
    ("state", "reason", "done", "changes"),
    [
        (["IDLE", "DRAIN", "POWERED_DOWN"], LENT, False, []),  # no slurmd registered yet
        (["IDLE", "DRAIN"], LENT, True, [("state=resume",)]),
        (["IDLE", "DRAIN"], "bad fan", True, []),  # a person's drain stays
        (["IDLE"], LENT, True, []),  # on demand: never drained
        (["IDLE", "DRAIN", "NOT_RESPONDING"], LENT, False, []),
    ],
)
def test_give_back_lifts_only_the_lent_drain_once_registered(slurm, state, reason, done, changes):
    fake = slurm((state, reason))
    assert power.give_back("n") is done
    assert fake.changes == changes


POWERED_DOWN = ["IDLE", "DRAIN", "POWERED_DOWN"]


def kept() -> dict[str, str]:
    return power.read_requests(paths.POWERED_DOWN_REASONS)  # the same format


@pytest.mark.parametrize("reason", [LENT, "bad fan"])
def test_a_reason_slurm_forgets_powering_up_is_put_back(slurm, reason):
    """Slurm with accounting storage: the node registers, powers up, keeps its drain, loses
    its reason. The lent drain comes back and is lifted; a person's comes back and stays."""
    slurm((POWERED_DOWN, reason))
    assert power.lend("n", "scaled", pod_gone=True) is True
    assert kept() == {"n": reason}
    fake = slurm((["IDLE", "DRAIN"], ""), (["IDLE", "DRAIN"], reason), (["IDLE"], reason))
    assert power.give_back("n") is True
    lifted = [("state=resume",)] if reason == LENT else []
    assert fake.changes == [("state=drain", f"reason={reason}"), *lifted]
    assert kept() == {}


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (["IDLE"], ""),  # resumed while powered down: nothing to put back
        (["IDLE", "DRAIN"], "bad fan"),  # drained again since, with a reason of its own
    ],
)
def test_a_node_changed_since_is_left_as_it_is(slurm, state, reason):
    slurm((POWERED_DOWN, LENT))
    power.keep_reasons([slurm_nodes.read_node("n")])
    fake = slurm((state, reason))
    (node,) = power.keep_reasons([slurm_nodes.read_node("n")])
    assert (node.reason, fake.changes, kept()) == (reason, [], {})


def test_the_newest_reason_of_a_powered_down_node_is_kept(slurm):
    slurm((POWERED_DOWN, LENT))
    power.keep_reasons([slurm_nodes.read_node("n")])
    slurm((POWERED_DOWN, "bad fan"))  # a person drained it again meanwhile
    power.keep_reasons([slurm_nodes.read_node("n")])
    assert kept() == {"n": "bad fan"}
    slurm((["IDLE", "POWERING_UP"], ""), (["IDLE", "NOT_RESPONDING"], ""))
    power.keep_reasons([slurm_nodes.read_node("n")])  # not up yet: kept
    assert kept() == {"n": "bad fan"}


@pytest.mark.parametrize("content", ["{}", "[]", '{"version": 1, "nodes": {"n": 3}}', "x"])
def test_a_reasons_file_not_slonks_drains_and_lifts_nothing(slurm, content):
    """An error for the syncer to say each pass; lending and giving back go on without it."""
    paths.POWERED_DOWN_REASONS.write_text(content)
    fake = slurm((["IDLE", "DRAIN"], ""))
    with pytest.raises(power.PowerError, match="reasons"):
        power.keep_reasons([slurm_nodes.read_node("n")])
    assert power.give_back("n") is True  # up, and no lent drain to lift
    assert fake.changes == []
    assert paths.POWERED_DOWN_REASONS.read_text() == content


@pytest.mark.parametrize(
    ("state", "flags"),
    [(["IDLE", "POWERED_DOWN"], []), (["MIXED", "NOT_RESPONDING", "POWERING_UP"], ["-b"])],
)
def test_slurmd_says_it_booted_only_for_a_node_slurm_powers_up(slurm, state, flags):
    slurm((state, ""))
    assert power.slurmd_flags("n") == flags


def test_slurmd_starts_as_ever_when_slurm_does_not_answer(monkeypatch):
    def fails(*args: str) -> str:
        raise slurm_nodes.SlurmError("scontrol show: Unable to contact slurm controller")

    monkeypatch.setattr(slurm_nodes, "scontrol", fails)
    assert power.slurmd_flags("n") == []


# The requests file.


def test_resume_records_each_node_once(tmp_path: Path):
    path = tmp_path / "requests.json"
    assert power.record_resume("slonk-gpu-[0-2],slonk-cpu-1", path) == [
        "slonk-gpu-0",
        "slonk-gpu-1",
        "slonk-gpu-2",
        "slonk-cpu-1",
    ]
    first = power.read_requests(path)
    power.record_resume("slonk-gpu-1,slonk-gpu-3", path)
    again = power.read_requests(path)
    assert again["slonk-gpu-1"] == first["slonk-gpu-1"]  # asked first at that time
    assert sorted(again) == ["slonk-cpu-1", "slonk-gpu-0", "slonk-gpu-1", "slonk-gpu-2",
                             "slonk-gpu-3"]  # fmt: skip
    document = json.loads(path.read_text())
    assert document["version"] == 1 and list(document["nodes"]) == sorted(document["nodes"])
    assert path.stat().st_mode & 0o777 == 0o644
    power.forget_requests(["slonk-gpu-0", "slonk-gpu-1", "not-asked"], path)
    assert sorted(power.read_requests(path)) == ["slonk-cpu-1", "slonk-gpu-2", "slonk-gpu-3"]


def test_asked_back_holds_the_requests_and_nodes_slurm_powers_up(tmp_path: Path):
    path = tmp_path / "requests.json"
    assert power.asked_back(CAPTURED.values(), path) == {"waking"}
    power.record_resume("lent", path)
    assert power.asked_back(CAPTURED.values(), path) == {"waking", "lent"}


@pytest.mark.parametrize(
    "hostlist",
    [
        "",
        "n" * (power.MAX_HOSTLIST_CHARS + 1),
        "n[1-",
        "n[0-99999999]",  # python-hostlist refuses ranges beyond 100000 names
        "a;b",
        "../x",
        "Node1",
        "a\nb",
        "a b",
        "-rf",
        "x" * 64,
        "n\u00e9",
        "$(reboot)",
    ],
)
def test_a_hostile_hostlist_records_nothing(tmp_path: Path, hostlist: str):
    path = tmp_path / "requests.json"
    power.record_resume("kept", path)
    before = path.read_bytes()
    with pytest.raises(power.PowerError):
        power.record_resume(hostlist, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["requests.json"]  # no temporary file left


@pytest.mark.parametrize(
    "content",
    ["", "[]", '{"version": 2, "nodes": {}}', '{"version": 1, "nodes": ["a"]}',
     '{"version": 1, "nodes": {"a": 1}}', "{"],
)  # fmt: skip
def test_a_requests_file_not_slonks_is_an_error_not_nothing_asked(tmp_path: Path, content):
    path = tmp_path / "requests.json"
    path.write_text(content)
    with pytest.raises(power.PowerError, match=r"requests\.json"):
        power.read_requests(path)
    with pytest.raises(power.PowerError):
        power.record_resume("n1", path)
    assert path.read_text() == content


def test_no_requests_file_is_no_request(tmp_path: Path):
    assert power.read_requests(tmp_path / "none.json") == {}
    power.forget_requests(["n1"], tmp_path / "none.json")
    assert not (tmp_path / "none.json").exists()


def test_resume_without_its_directory_is_one_error(tmp_path: Path):
    with pytest.raises(power.PowerError, match="cannot open"):
        power.record_resume("n1", tmp_path / "missing" / "requests.json")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another user")
def test_resume_as_slurmuser_replaces_a_file_root_wrote():
    """The syncer (root) forgets, slurmctld's ResumeProgram (SlurmUser) records: the lock is
    on the directory, which both open, and a rename replaces the other's file."""
    directory = Path(tempfile.mkdtemp())  # in /tmp, which another user can reach
    os.chown(directory, 65534, 65534)
    path = directory / "requests.json"
    power.record_resume("n1", path)  # as root
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        try:
            os.setgid(65534)
            os.setuid(65534)
            power.record_resume("n2", path)
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    try:
        assert os.waitstatus_to_exitcode(status) == 0
        assert sorted(power.read_requests(path)) == ["n1", "n2"]
    finally:
        shutil.rmtree(directory)
