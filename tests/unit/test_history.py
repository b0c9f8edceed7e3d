"""The node history (slonk.health.history), its events (slonk.metrics.node_events), the GPU
serials' channel (slonk.health.serials) and `slonk nodes` (slonk.node_report): hostile text,
corrupt lines, concurrent writers, compaction."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slonk import node_report
from slonk.health import history, serials
from slonk.metrics import node_events
from slonk.slurm import slurm_nodes
from slonk.slurm.slurm_state import NodeState

from . import slurm_json

FAKE_GPU = Path(__file__).parents[1] / "fakes" / "fake-gpu"


def _event(n: int, kind: str = "drain", **fields: Any) -> history.Event:
    values: dict[str, Any] = {
        "time": 1000.0 + n,
        "event": kind,
        "node": "slonk-gpu-1",
        "machine": "node-a",
        "gpus": ("1654000000010", "1654000000011"),
        "pod": "slonk-gpu-1",
        "podUID": f"uid-{n}",
        "cause": "gpu",
        "reason": f"slonk:gpu: event {n}",
    }
    return history.Event(**(values | fields))


def test_events_read_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    written = [_event(0), _event(1, "resume"), _event(2, "recycle"), _event(3, "quarantine")]
    history.append(written[:2], path)
    history.append(written[2:], path)
    assert history.read(path) == written
    assert history.read(tmp_path / "none.jsonl") == []


def test_a_hostile_reason_is_one_bounded_line(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    hostile = 'a\nb\r\n{"event": "resume"}\u2028c\x1b[2J\x00' + "x" * 100_000
    history.append([_event(0, reason=hostile, node="n\nforged")], path)
    lines = path.read_bytes().splitlines()
    assert len(lines) == 1 and lines[0].isascii()
    (back,) = history.read(path)
    assert back.reason == hostile[: history.MAX_TEXT]
    assert back.node == "n\nforged" and back.event == "drain"


def test_corrupt_lines_are_skipped_and_counted_and_the_rest_kept(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    history.append([_event(0)], path)
    with path.open("ab") as f:
        f.write(b"not json\n[1, 2]\n{}\n")
        f.write(b'{"time": "soon", "event": "drain"}\n')  # a string time
        f.write(b'{"time": 1, "event": "explode"}\n')  # no such event
        f.write(b'{"time": 1, "event": "drain", "gpus": "abc"}\n')
        f.write(b'{"time": 1, "event": "drain", "node": 7}\n')
        f.write(b'{"time": true, "event": "drain"}\n')
        f.write(b"\xff\xfe\n\n")
    history.append([_event(1)], path)
    with path.open("ab") as f:
        f.write(b'{"time": 5, "event": "dra')  # a writer cut short: not a line yet
    read = history.load(path)
    assert read.events == [_event(0), _event(1)]
    assert read.skipped == 9
    events, offset = history.follow(path, 0)
    assert len(events) == 2 and offset == path.stat().st_size - len(b'{"time": 5, "event": "dra')


def _append_many(path: str, writer: int, count: int) -> None:
    for n in range(count):
        history.append([_event(n, node=f"writer-{writer}", reason="r" * 300)], Path(path))


@pytest.mark.parametrize("compacting", [False, True], ids=["plain", "compacting"])
def test_concurrent_writers_lose_no_line_and_tear_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compacting: bool
) -> None:
    path = tmp_path / "h.jsonl"
    if compacting:  # forked writers inherit the small bound: they compact under each other
        monkeypatch.setattr(history, "MAX_BYTES", 40_000)
        monkeypatch.setattr(history, "KEEP_BYTES", 20_000)
    writers, count = 4, 150
    context = multiprocessing.get_context("fork")
    procs = [
        context.Process(target=_append_many, args=(str(path), w, count)) for w in range(writers)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    read = history.load(path)
    assert read.skipped == 0
    # Compaction drops the oldest lines: what each writer has left is its newest lines, none
    # missing between them.
    kept = {w: [e.time for e in read.events if e.node == f"writer-{w}"] for w in range(writers)}
    for times in kept.values():
        assert times == [1000.0 + n for n in range(count - len(times), count)]
    if compacting:
        assert path.stat().st_size <= 40_000 + 4 * 600
        assert any(kept.values())
    else:
        assert len(read.events) == writers * count


def test_compaction_keeps_the_newest_and_followers_resume_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "h.jsonl"
    monkeypatch.setattr(history, "MAX_BYTES", 10_000)
    monkeypatch.setattr(history, "KEEP_BYTES", 5_000)
    history.append([_event(n) for n in range(10)], path)
    seen, offset = history.follow(path, 0)
    assert [e.podUID for e in seen] == [f"uid-{n}" for n in range(10)]
    for n in range(10, 60):  # compacts several times
        history.append([_event(n)], path)
    assert path.stat().st_size <= 10_000
    kept = history.read(path)
    assert kept[-1] == _event(59)
    assert [e.podUID for e in kept] == [f"uid-{n}" for n in range(60 - len(kept), 60)]
    # A follower whose place was compacted away goes on from the oldest line kept, once.
    more, offset = history.follow(path, offset)
    assert more == kept
    history.append([_event(60)], path)
    newest, offset = history.follow(path, offset)
    assert newest == [_event(60)]
    assert history.follow(path, offset) == ([], offset)
    # A follower that was reading when the file was compacted resumes where it was.
    before = offset
    for n in range(61, 80):
        history.append([_event(n)], path)
        got, offset = history.follow(path, offset)
        assert got == [_event(n)]
    assert offset > before
    # An offset past the end is another file's (deleted, made anew): from its start.
    path.unlink()
    history.append([_event(99)], path)
    assert history.follow(path, offset)[0] == [_event(99)]


def _node(name: str, state: str = "idle", reason: str = "", extra: str = "") -> NodeState:
    base, *flags = state.split("+")
    return NodeState(name, base, frozenset(flags), reason, "1", extra=extra)


def test_changes_between_passes_are_drains_and_resumes_whoever_made_them() -> None:
    before: dict[str, str | None] = {"b": "maintenance", "c": "slonk:gpu: x", "d": None}
    now = [
        _node("a", "idle+DRAIN", "slonk:gpu: 1 of 2 GPUs visible"),  # new drain
        _node("b", "idle+DRAIN", "maintenance"),  # unchanged
        _node("c", "idle+DRAIN", "slonk:quarantine: recycled 2 times"),  # a new reason
        _node("d", "down", "Not responding"),  # down counts as out of service
        _node("e", "idle"),  # never seen, in service: nothing
    ]
    found = [(kind, node.name, reason) for kind, node, reason in node_events.changes(before, now)]
    assert found == [
        ("drain", "a", "slonk:gpu: 1 of 2 GPUs visible"),
        ("drain", "c", "slonk:quarantine: recycled 2 times"),
        ("drain", "d", "Not responding"),
    ]
    # Lent: powered down, and powering up with the reason Slurm cleared: no new drain.
    lent = [_node("b", "idle+POWERED_DOWN", "maintenance"), _node("c", "mixed+POWERING_UP")]
    assert node_events.changes(before, lent) == []
    resumed = node_events.changes(before, [_node("b", "idle"), _node("c", "mixed")])
    assert [(k, n.name, r) for k, n, r in resumed] == [
        ("resume", "b", "maintenance"),  # the resume carries what it lifted
        ("resume", "c", "slonk:gpu: x"),
    ]


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self.events.append((namespace, body))


def _pod(name: str, machine: str, uid: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid}, "spec": {"nodeName": machine}}


def test_the_observer_records_each_change_once_across_restarts(tmp_path: Path) -> None:
    path, machines = tmp_path / "h.jsonl", tmp_path / "machines.json"
    extra = json.dumps({serials.EXTRA_KEY: ["1654000000010"], "site": "theirs"})
    pods = {"slonk-gpu-1": _pod("slonk-gpu-1", "node-a", "uid-1")}
    drained = {"slonk-gpu-1": _node("slonk-gpu-1", "idle+DRAIN", "slonk:gpu: lost", extra)}
    sink, said = Sink(), []
    history.append([_event(0, "resume", node="slonk-gpu-9")], path)  # not the first pass ever
    observer = node_events.Observer("hpc", said.append, path, machines, tmp_path / "seen.json")
    (e,) = observer.observe(drained, pods, sink, 1000.0)
    assert (e.event, e.machine, e.gpus, e.podUID, e.cause) == (
        "drain", "node-a", ("1654000000010",), "uid-1", "gpu"
    )  # fmt: skip
    assert observer.observe(drained, pods, sink, 1001.0) == []
    on_pod, on_node = sink.events
    assert on_pod[0] == "hpc" and on_pod[1]["involvedObject"] == {
        "apiVersion": "v1", "kind": "Pod", "name": "slonk-gpu-1", "namespace": "hpc", "uid": "uid-1"
    }  # fmt: skip
    assert on_node[0] == "default" and on_node[1]["involvedObject"] == {
        "apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-a"
    }  # fmt: skip
    assert on_node[1]["reason"] == "SlurmNodeDrained" and "slonk:gpu: lost" in on_node[1]["message"]
    assert node_events.load_machines(machines) == {"slonk-gpu-1": "node-a"}
    # A new syncer (restarted) knows the drain from the history: it is not recorded again,
    # and the resume that happened while it was away is.
    again = node_events.Observer("hpc", said.append, path, machines, tmp_path / "seen.json")
    assert again.observe(drained, pods, None, 1002.0) == []
    (resumed,) = again.observe({"slonk-gpu-1": _node("slonk-gpu-1")}, pods, None, 1003.0)
    assert (resumed.event, resumed.reason, resumed.cause) == ("resume", "slonk:gpu: lost", "gpu")
    assert [e.event for e in history.read(path)] == ["resume", "drain", "resume"]
    assert said == []


def test_a_syncer_started_again_after_a_compaction_records_no_drain_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long drain's line compacted away: the syncer's own record still knows it."""
    monkeypatch.setattr(history, "MAX_BYTES", 4000)
    monkeypatch.setattr(history, "KEEP_BYTES", 2000)
    path, machines, seen = tmp_path / "h.jsonl", tmp_path / "m.json", tmp_path / "seen.json"
    old = _node("old", "idle+DRAIN", "slonk:gpu: xid 79")
    flapping = [{"old": old, "flap": _node("flap", "idle+DRAIN" if i % 2 else "idle", "x")}
                for i in range(60)]  # fmt: skip
    observer = node_events.Observer("hpc", print, path, machines, seen)
    for i, nodes in enumerate(flapping):
        observer.observe(nodes, {}, None, float(i))
    assert "old" not in {e.node for e in history.read(path)}  # compacted away
    again = node_events.Observer("hpc", print, path, machines, seen)
    assert again.observe(flapping[-1], {}, None, 99.0) == []


def test_the_first_pass_ever_sends_no_events_and_a_pass_sends_a_bounded_number(
    tmp_path: Path,
) -> None:
    """The first pass after an upgrade finds every drained or lent node: how things stand,
    recorded, no news to send. Later, a mass change sends MAX_EVENTS_PER_PASS, records all."""
    path, machines = tmp_path / "h.jsonl", tmp_path / "machines.json"
    sink, said = Sink(), []
    many = node_events.MAX_EVENTS_PER_PASS + 5
    drained = {f"n{i}": _node(f"n{i}", "idle+DRAIN", "maintenance") for i in range(many)}
    observer = node_events.Observer("hpc", said.append, path, machines, tmp_path / "seen.json")
    assert len(observer.observe(drained, {}, sink, 1.0)) == many
    assert sink.events == [] and said == [f"{many} node events recorded, not sent as Events"]
    resumed = {name: _node(name) for name in drained}
    assert len(observer.observe(resumed, {}, sink, 2.0)) == many
    assert len(sink.events) == node_events.MAX_EVENTS_PER_PASS  # pods alone: no machine known
    assert len(history.read(path)) == 2 * many


def test_a_history_that_cannot_be_written_stops_nothing(tmp_path: Path) -> None:
    said: list[str] = []
    observer = node_events.Observer(
        "hpc",
        said.append,
        tmp_path / "no-such-dir" / "h.jsonl",
        tmp_path / "nope" / "m.json",
        tmp_path / "nope" / "seen.json",
    )
    drained = {"n": _node("n", "idle+DRAIN", "maintenance")}
    assert [e.event for e in observer.observe(drained, {}, Sink(), 1.0)] == ["drain"]
    assert any("could not record 1 node event" in line for line in said)


def test_an_event_message_is_bounded() -> None:
    event = _event(0, reason="y" * 5000, gpus=tuple(f"{n:013d}" for n in range(64)))
    for _, body in node_events.bodies(event, "hpc"):
        assert len(body["message"]) <= node_events.MAX_MESSAGE


def test_an_event_message_carries_no_terminal_controls() -> None:
    """Root in any worker may set a reason: `kubectl describe` prints it to a person."""
    event = _event(0, reason="slonk:gpu: x\x1b]0;owned\x07\nFAKE: line\u2028")
    for _, body in node_events.bodies(event, "hpc"):
        assert body["message"].isprintable(), body["message"]
        assert "FAKE" in body["message"]  # shown, not dropped


def test_serials_ride_on_extra_and_a_sites_extra_is_left_alone() -> None:
    assert serials.encode("", ["1654000000010"]) == '{"slonk.gpuSerials":["1654000000010"]}'
    theirs = '{"rack": "r12"}'
    merged = serials.encode(theirs, ["1654000000010"])
    assert merged is not None and json.loads(merged) == {
        "rack": "r12", serials.EXTRA_KEY: ["1654000000010"]
    }  # fmt: skip
    assert serials.encode(merged, ["1654000000010"]) is None  # already so: no update
    assert serials.encode(merged, []) == '{"rack":"r12"}'  # a pod with no GPUs clears them
    assert serials.encode("rack 12, row 3", ["1"]) is None  # a site's text: not slonk's
    assert serials.decode("rack 12") == ()
    hostile = json.dumps({serials.EXTRA_KEY: ["1654", "x\ny", 7, "-a", "ok-1", "z" * 99]})
    assert serials.decode(hostile) == ("1654", "ok-1")


def test_the_fake_nvidia_smi_answers_serials_as_nvidia_smi_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = {"nvidiaSmi": f"{FAKE_GPU} nvidia-smi"}
    monkeypatch.setenv("FAKE_GPU_SCENARIO", str(tmp_path / "scenario"))
    found = serials.query(options, 10)
    assert len(found) == 2 and all(len(s) == 13 and s.isdigit() for s in found)
    assert found == serials.query(options, 10)  # the machine's own, every time
    (tmp_path / "scenario").write_text("lost\n")
    assert serials.query(options, 10) == []  # nvidia-smi failing names no GPU


def test_nodes_history_finds_a_machine_across_pods_and_prints_one_line_each(
    tmp_path: Path,
) -> None:
    events = [
        _event(0, "recycle", podUID="pod-one"),
        _event(1, "recycle", podUID="pod-two"),
        _event(2, "quarantine", podUID="pod-three", reason="slonk:quarantine:\n\x1b[31mred"),
        _event(3, "drain", node="slonk-gpu-2", machine="node-b", gpus=()),
    ]
    printed = node_report.history_table(reversed(events), "node-a")
    lines = printed.splitlines()
    assert [line.split()[2] for line in lines[1:]] == ["recycle", "recycle", "quarantine"]
    assert "\x1b" not in printed and "slonk:quarantine:??[31mred" in printed
    assert len(node_report.history_table(events, "1654000000011").splitlines()) == 4  # by GPU
    assert len(node_report.history_table(events, "slonk-gpu-2").splitlines()) == 2  # by node
    assert len(node_report.history_table(events, None).splitlines()) == 5


def test_nodes_shows_state_cause_since_and_recycles_in_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = [
        _node("slonk-gpu-1", "idle+DRAIN", "slonk:quarantine: recycled 2 times"),
        _node("slonk-gpu-2", "idle", "stale reason"),
        _node("slonk-gpu-3", "idle+RESERVED", ""),  # held by the block checks' gate
    ]
    monkeypatch.setattr(slurm_nodes, "read_nodes", lambda *names: nodes)
    monkeypatch.setattr(node_report.gate, "held", lambda: {"slonk-gpu-3"})
    monkeypatch.setattr(node_events, "load_machines", lambda path=None: {"slonk-gpu-2": "node-b"})
    events = [_event(0, "recycle"), _event(500, "recycle"), _event(600, "drain")]
    lines = node_report.overview(events, window_seconds=300, now=1700.0).splitlines()
    assert lines[0].split() == ["NODE", "STATE", "CAUSE", "SINCE", "RECYCLES", "MACHINE"]
    assert lines[1].split() == [
        "slonk-gpu-1", "idle+drain", "quarantine", "1970-01-01", "00:26:40", "1", "node-a"
    ]  # fmt: skip
    assert lines[2].split() == ["slonk-gpu-2", "idle", "none", "-", "0", "node-b"]
    assert lines[3].split() == ["slonk-gpu-3", "idle+reserved", "gate", "-", "0", "-"]


def test_a_write_the_volume_cuts_short_loses_only_its_own_events(tmp_path: Path) -> None:
    """A volume that fills mid-line (RLIMIT_FSIZE stands in for it, in a child process): the
    part written is taken back, and the next append, once there is room, reads whole."""
    path = tmp_path / "history.jsonl"
    history.append([_event(0)], path)
    room = path.stat().st_size + 40  # less than a line
    code = (
        "import pathlib, resource, signal\n"
        "from slonk.health import history\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({room}, resource.RLIM_INFINITY))\n"
        "event = history.Event(time=1.0, event='drain', node='cut-short')\n"
        f"history.record([event], print, pathlib.Path({str(path)!r}))\n"
    )
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "could not record 1 node event" in said.stdout
    history.append([_event(2)], path)
    found = history.load(path)
    assert ([e.podUID for e in found.events], found.skipped) == (["uid-0", "uid-2"], 0)


def test_a_line_a_killed_writer_left_half_written_is_the_only_one_lost(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    history.append([_event(0)], path)
    with path.open("ab") as file:
        file.write(_event(1).line()[:30])
    history.append([_event(2)], path)
    found = history.load(path)
    assert ([e.podUID for e in found.events], found.skipped) == (["uid-0", "uid-2"], 1)


@pytest.mark.parametrize("stamp", [b"NaN", b"Infinity", b"1e300", b"-1", b"true"])
def test_a_line_with_an_impossible_time_is_skipped(tmp_path: Path, stamp: bytes) -> None:
    path = tmp_path / "history.jsonl"
    path.write_bytes(b'{"time": %s, "event": "drain", "node": "bad"}\n' % stamp)
    found = history.load(path)
    assert (found.events, found.skipped) == ([], 1)
    node_report.history_table(found.events, None)  # prints, never raises


def test_serials_reach_the_node_once_slurm_answers_and_a_pod_without_gpus_clears_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first health run may come before Slurm answers: later runs try again, once done
    no more. A pod with no GPUs (or no gpu check) takes the last pod's serials away."""
    done = tmp_path / "reported"
    stale = '{"slonk.gpuSerials":["1654000000010"]}'
    calls: list[tuple[str, ...]] = []

    def scontrol(*args: str) -> str:
        calls.append(args)
        if len(calls) == 1:
            raise slurm_nodes.SlurmError("scontrol show timed out")
        if args[0] == "show":
            record = slurm_json.node("slonk-gpu-1", ["IDLE"])
            record["extra"] = stale
            return slurm_json.nodes(record)
        return ""

    monkeypatch.setattr(slurm_nodes, "scontrol", scontrol)
    monkeypatch.setattr(serials, "saved", lambda: [])
    with pytest.raises(slurm_nodes.SlurmError):
        serials.report("slonk-gpu-1", done)
    assert not done.exists()
    assert serials.report("slonk-gpu-1", done) == "GPU serials on the node: none"
    assert calls[-1] == ("update", "nodename=slonk-gpu-1", "extra=")
    assert done.exists()
    calls.clear()
    assert serials.report("slonk-gpu-1", done) is None and calls == []


def test_a_syncer_started_again_reads_the_history_written_after_its_record(
    tmp_path: Path,
) -> None:
    """Killed between the history and its own record (or another syncer wrote since): the
    events past the record's offset are replayed over it, none recorded twice."""
    path, machines, seen = tmp_path / "h.jsonl", tmp_path / "m.json", tmp_path / "seen.json"
    history.append([_event(0, "resume", node="other")], path)
    drained = {"n": _node("n", "idle+DRAIN", "maintenance")}
    node_events.Observer("hpc", print, path, machines, seen).observe(drained, {}, None, 1.0)
    history.append([history.Event(time=2.0, event="resume", node="n", reason="maintenance")], path)
    again = node_events.Observer("hpc", print, path, machines, seen)
    assert again.observe({"n": _node("n")}, {}, None, 3.0) == []
