"""Local mode's parts for many pods: addresses past a /24, the nodes line as counts, the
host limits `up` raises (on a fake /proc/sys), what `down` marks DOWN in one call."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import hostlist
import pytest

from slonk.local import host, nodes
from slonk.local.network import MAX_PODS, address_index, pod_address, pod_addresses
from slonk.local.nodes import printer, summary
from slonk.slurm.slurm_state import NodeState


def test_addresses_run_past_a_slash_24_and_name_their_port():
    addresses = pod_addresses([f"slonk-cpu-{i}" for i in range(300)], {})
    assert addresses["slonk-cpu-0"] == "10.73.0.10"  # as before: a cluster made then keeps its
    assert addresses["slonk-cpu-245"] == "10.73.0.255"
    assert addresses["slonk-cpu-246"] == "10.73.1.0"
    assert addresses["slonk-cpu-299"] == "10.73.1.53"
    assert len(set(addresses.values())) == 300
    assert [address_index(a) for a in addresses.values()] == list(range(300))
    with pytest.raises(ValueError, match=f"at most {MAX_PODS} pods"):
        pod_address(MAX_PODS)


def _node(name: str, state: str, *flags: str, reason: str = "") -> NodeState:
    return NodeState(name=name, state=state, flags=frozenset(flags), reason=reason)


def test_the_nodes_line_counts_states_and_names_no_node():
    states = {f"n{i}": _node(f"n{i}", "idle") for i in range(200)}
    states["n200"] = _node("n200", "down", "NOT_RESPONDING")
    expected = [f"n{i}" for i in range(256)]
    assert summary(states, expected) == "200 idle, 55 not registered, 1 down+not_responding"
    assert summary({}, []) == ""


def _sysctls(tmp_path: Path, values: dict[str, int]) -> Path:
    for key, value in values.items():
        (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / key).write_text(f"{value}\n")
    return tmp_path


def test_up_raises_only_the_limits_below_what_its_pods_need(tmp_path: Path):
    needed = host.needed(262)
    low = {key: 128 for key in needed}
    low["kernel/pid_max"] = 4194304  # above: left alone, never lowered
    root = _sysctls(tmp_path, low)
    said: list[str] = []
    host.raise_limits(262, said.append, root=root)
    for key, least in needed.items():
        current = int((root / key).read_text())
        assert current == (4194304 if key == "kernel/pid_max" else least)
    assert len(said) == 1 and "fs.inotify.max_user_instances 128 -> " in said[0]
    assert "pid_max" not in said[0]

    said.clear()
    host.raise_limits(262, said.append, root=root)  # enough now: nothing to say
    assert said == []


def test_a_limit_the_kernel_lacks_is_reported_and_the_rest_raised(tmp_path: Path):
    needed = host.needed(10)
    root = _sysctls(tmp_path, {k: 1 for k in needed if k != "kernel/pid_max"})
    said: list[str] = []
    host.raise_limits(10, said.append, root=root)
    assert any(line.startswith("slonk local: could not raise kernel.pid_max") for line in said)
    assert (
        int((root / "fs/inotify/max_user_instances").read_text())
        == needed["fs/inotify/max_user_instances"]
    )


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_nodes_line_is_rewritten_in_place():
    out = _Terminal()
    show = printer(out)
    for message in ("slonk local: 3 pods", "  nodes: 2 not registered", "  nodes: 2 idle", "up"):
        show(message)
    assert out.getvalue() == (
        "slonk local: 3 pods\n  nodes: 2 not registered\r\033[K  nodes: 2 idle\nup\n"
    )
    piped = io.StringIO()
    show = printer(piped)
    show("  nodes: 2 idle")
    show("up")
    assert piped.getvalue() == "  nodes: 2 idle\nup\n"


def test_a_signal_counts_as_taken_once_handled_or_blocked():
    import signal
    import subprocess
    import sys

    from slonk.local.pod import handles

    script = "import signal, sys, time; {}; print('ready', flush=True); time.sleep(30)"
    for setup, expected in (
        ("pass", False),
        ("signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})", True),
        ("signal.signal(signal.SIGTERM, lambda *a: None)", True),
    ):
        child = subprocess.Popen(
            [sys.executable, "-c", script.format(setup)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            assert handles(child.pid, signal.SIGTERM) is expected, setup
        finally:
            child.kill()
            child.wait()


class FakeController:
    """slurmctld's answers to mark_down: `scontrol update ... state=drain|down` applied to its
    nodes (DOWN keeps DRAIN, as Slurm 24.11 does)."""

    def __init__(self, states: dict[str, NodeState]):
        self.states, self.said = dict(states), []

    def node_states(self, cluster: object) -> dict[str, NodeState]:
        return dict(self.states)

    def run(self, cluster: object, *command: str) -> str:
        self.said.append(" ".join(command))
        setting, reason = command[3], command[4].removeprefix("reason=")
        for name in hostlist.expand_hostlist(command[2].removeprefix("nodename=")):
            node = self.states[name]
            if setting == "state=down":
                node = dataclasses.replace(node, state="down", reason=reason)
            elif setting == "state=drain":
                node = dataclasses.replace(node, flags=node.flags | {"DRAIN"}, reason=reason)
            self.states[name] = node
        return ""


def _mark_down(monkeypatch, controller: FakeController, workers: list[str]) -> list[str]:
    """The scontrol commands and progress lines of `down`'s mark_down."""
    monkeypatch.setattr(nodes, "node_states", controller.node_states)
    monkeypatch.setattr(nodes, "_controller_run", controller.run)
    monkeypatch.setattr(nodes, "RETRY_SECONDS", 0.0)
    nodes.mark_down(None, workers, controller.said.append)  # type: ignore[arg-type]
    return controller.said


STATES = {
    "w-idle-1": _node("w-idle-1", "idle"),
    "w-idle-2": _node("w-idle-2", "idle"),
    "w-busy": _node("w-busy", "allocated"),
    # Not responding (a loaded controller): it may still hold a job, a ghost after `up`.
    "w-silent": _node("w-silent", "allocated", "NOT_RESPONDING"),
    "w-ours": _node("w-ours", "idle", "DRAIN", reason="slonk:pod: stopping"),
    "w-person": _node("w-person", "allocated", "DRAIN", reason="hands off"),
    "w-check": _node("w-check", "idle", "DRAIN", reason="slonk:gpu: ecc"),
    "w-down": _node("w-down", "down", "NOT_RESPONDING"),
    "w-lent": _node("w-lent", "idle", "POWERED_DOWN"),
}


def test_down_marks_every_worker_left_up_and_keeps_anothers_drain_and_words(monkeypatch):
    controller = FakeController(STATES)
    said = _mark_down(monkeypatch, controller, [*STATES, "w-unknown"])
    ours = "w-busy,w-idle-[1-2],w-ours,w-silent"
    assert said == [
        # one call each for all the nodes left up, whatever their number: drained first, so
        # that a late message returning a DOWN node to service brings no job onto it
        f"scontrol update nodename={ours} state=drain reason=slonk:pod: stopping",
        f"scontrol update nodename={ours} state=down reason=slonk:pod: stopping",
        # a person's drain that still holds a job: DOWN, in their words (DRAIN stays)
        "scontrol update nodename=w-person state=down reason=hands off",
        "  marked 6 nodes down",
    ]
    after = controller.states
    assert all(after[n].state == "down" and nodes.held_by_a_stopped_pod(after[n])
               for n in hostlist.expand_hostlist(ours))  # fmt: skip
    assert after["w-person"].reason == "hands off"
    assert not nodes.held_by_a_stopped_pod(after["w-person"])
    assert after["w-check"] == STATES["w-check"] and after["w-lent"] == STATES["w-lent"]


def test_down_says_so_when_the_controller_does_not_answer(monkeypatch):
    monkeypatch.setattr(nodes, "DOWN_WAIT_SECONDS", 0.0)
    said = _mark_down(monkeypatch, FakeController({}), ["w-0", "w-1"])
    assert len(said) == 1 and said[0].startswith("  the controller did not answer for 0 s: 2 ")
    assert _mark_down(monkeypatch, FakeController({}), []) == []
