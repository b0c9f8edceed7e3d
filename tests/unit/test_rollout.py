"""The controller's rollout decisions: what slurmctld reads, what is taken back, what waits.

slurmctld itself is played by a stand-in that answers as Slurm 24.11.5 was measured to
(slonk.slurm.slurmctld; tests/integration/test_config_rollout.py runs the real one): a reconfigure
re-executes it, and the new process dies on files naming a select plugin it does not have;
scontrol, which reads the files first, refuses one with a key it does not know, and
slurmctld keeps running the previous files. It can be made to stop answering.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from slonk.base import paths
from slonk.config.render import render
from slonk.config.spec import parse_spec, read_spec
from slonk.pod.config_watch import (
    FOLLOWED,
    IN_DOUBT,
    Controller,
    Follower,
    NotApplied,
    NotNow,
    fingerprint,
    handled_last,
)
from slonk.slurm import rollout
from slonk.slurm.slurmctld import Refused, _what_it_said, needs_restart

VERSION = "slurm-wlm 24.11.5"
FATAL = "fatal: Can't find plugin for select/bogus"
# What `scontrol reconfigure` printed on a file with BogusKey=1 (exit 1), as slonk says it.
PARSE = (
    "error: _parse_next_key: Parsing error at unrecognized key: BogusKey; "
    "fatal: Unable to process configuration file"
)


@dataclass
class StandIn:
    """Runs whatever files are in `conf_dir`, unless they name select/bogus (it dies) or
    BogusKey (scontrol will not send them)."""

    conf_dir: Path
    answering: bool = True
    calls: list[str] = field(default_factory=list)

    def _conf(self) -> str:
        return (self.conf_dir / "slurm.conf").read_text()

    def _runs_them(self, how: str) -> None:
        self.calls.append(how)
        if "select/bogus" in self._conf():
            self.answering = False  # it died, and is left down
            raise Refused(FATAL)
        self.answering = True

    def version(self) -> str:
        return VERSION

    def answers(self) -> bool:
        return self.answering

    def restart(self) -> None:
        self._runs_them("restarted")

    def reconfigure(self) -> str:
        if "BogusKey" in self._conf():
            self.calls.append("scontrol refused")
            raise Refused(PARSE)
        self._runs_them("reconfigured")
        return "sent it to the slurmds"

    def started(self) -> None:
        self._runs_them("started")

    def recover(self) -> bool:
        self.calls.append("recover")
        self.answering = "select/bogus" not in self._conf()
        return self.answering

    def push(self) -> str:
        self.calls.append("push")
        return "sent it to the slurmds"

    def keep_up(self) -> None:
        pass


@pytest.fixture
def controller(tmp_path) -> Controller:
    conf = tmp_path / "slurmctld"
    return Controller(conf, rollout.Record(tmp_path / "record.json"), StandIn(conf))


def _spec(demo_spec, **slurm_conf):
    if slurm_conf:
        demo_spec = {**demo_spec, "slurmConf": slurm_conf}
    return parse_spec(demo_spec)


def test_a_change_is_applied_by_a_reconfigure_which_reaches_the_slurmds(controller, demo_spec):
    assert controller.apply(_spec(demo_spec)).startswith("rewrote cgroup.conf, gres.conf, ")
    assert controller.apply(_spec(demo_spec)) == "no change to the Slurm configuration"
    demo_spec["partitions"]["gpu"]["maxTime"] = 60
    assert controller.apply(_spec(demo_spec)) == (
        "rewrote slurm.conf; slurmctld runs it; sent it to the slurmds"
    )
    demo_spec["nodepools"]["cpu"]["replicas"] = 3
    assert controller.apply(_spec(demo_spec)) == (
        "rewrote slurm.conf, topology.conf; slurmctld runs it; sent it to the slurmds"
    )
    # Nothing to reconfigure at first: a start, then a push. A reconfigure sends the files
    # to every slurmd itself (measured: each slurmd re-reads them).
    assert controller.daemon.calls == ["restarted", "push", "reconfigured", "reconfigured"]
    assert controller.record.accepted() == rollout.read_files(controller.conf_dir)


def test_settings_only_a_restart_applies_restart_slurmctld(controller, demo_spec):
    controller.apply(_spec(demo_spec))
    demo_spec["slurmctldPort"] = 6900
    assert controller.apply(_spec(demo_spec)) == (
        "rewrote slurm.conf; slurmctld runs it; sent it to the slurmds"
    )
    controller.apply(_spec(demo_spec, AuthType="auth/slurm"))
    assert controller.daemon.calls == ["restarted", "push"] * 3


def test_what_needs_a_restart():
    old = (
        "SlurmctldPort=6817\nAuthType=auth/munge\nNodeName=a CPUs=1\nSelectType=select/cons_tres\n"
    )
    assert needs_restart(old, old.replace("CPUs=1", "CPUs=2")) == []
    assert needs_restart(old, old.replace("cons_tres", "linear")) == []
    assert needs_restart(old, old.replace("6817", "6900")) == ["slurmctldport"]
    assert needs_restart(old, old.replace("AuthType", "authtype").replace("munge", "slurm")) == [
        "authtype"
    ]
    assert needs_restart(old, old + "SlurmUser=root\n") == ["slurmuser"]


def test_a_refused_configuration_is_taken_back_and_never_tried_again(controller, demo_spec):
    controller.apply(_spec(demo_spec))
    good = rollout.read_files(controller.conf_dir)
    demo_spec["nodepools"]["cpu"]["replicas"] = 3
    bad = _spec(demo_spec, SelectType="select/bogus")
    with pytest.raises(NotApplied, match=f"^{FATAL}$"):
        controller.apply(bad)
    assert rollout.read_files(controller.conf_dir) == good
    assert controller.record.accepted() == good
    assert controller.daemon.calls[-2:] == ["reconfigured", "recover"]
    assert controller.daemon.answers()
    tries = len(controller.daemon.calls)
    with pytest.raises(NotApplied, match=rf"refused this configuration before \({FATAL}\)"):
        controller.apply(bad)
    assert len(controller.daemon.calls) == tries
    assert "push" not in controller.daemon.calls[2:]  # nothing went to the slurmds
    # What runs is still what was accepted: going back to it is no change at all.
    demo_spec["nodepools"]["cpu"]["replicas"] = 2
    assert controller.apply(_spec(demo_spec)) == "no change to the Slurm configuration"


def test_files_scontrol_refuses_never_reach_slurmctld(controller, demo_spec):
    """scontrol reads the new files before it asks slurmctld to: slurmctld keeps running
    the previous ones, and is not restarted to get them back."""
    controller.apply(_spec(demo_spec))
    good = rollout.read_files(controller.conf_dir)
    with pytest.raises(NotApplied, match=f"^{PARSE}$"):
        controller.apply(_spec(demo_spec, BogusKey=1))
    assert rollout.read_files(controller.conf_dir) == good
    assert controller.record.accepted() == good
    assert controller.daemon.calls[-1] == "scontrol refused"


def test_a_refusal_counts_for_its_slurm_version_only(controller, demo_spec):
    controller.apply(_spec(demo_spec))
    with pytest.raises(NotApplied):
        controller.apply(_spec(demo_spec, SelectType="select/bogus"))
    controller.version = "slurm 24.11.1"  # an image with another Slurm: it decides again
    with pytest.raises(NotApplied, match=f"^{FATAL}$"):
        controller.apply(_spec(demo_spec, SelectType="select/bogus"))


def test_an_unanswering_slurmctld_changes_nothing(controller, demo_spec):
    controller.apply(_spec(demo_spec))
    before = rollout.read_files(controller.conf_dir)
    controller.daemon.answering, calls = False, len(controller.daemon.calls)
    demo_spec["partitions"]["gpu"]["maxTime"] = 60
    with pytest.raises(NotNow, match="slurmctld is not answering"):
        controller.apply(_spec(demo_spec))
    assert rollout.read_files(controller.conf_dir) == before
    assert len(controller.daemon.calls) == calls


def test_with_nothing_accepted_a_silent_slurmctld_is_started_on_the_new_files(
    controller, demo_spec
):
    """A first configuration it could not run leaves nothing to protect: a fix goes in."""
    rollout.write_files(controller.conf_dir, render(_spec(demo_spec, SelectType="select/x")))
    controller.daemon.answering = False
    assert "slurmctld runs it" in controller.apply(_spec(demo_spec))


def test_a_pod_restarted_on_a_refused_configuration_starts_on_the_accepted_one(
    controller, demo_spec
):
    controller.apply(_spec(demo_spec))
    good = rollout.read_files(controller.conf_dir)
    bad = render(_spec(demo_spec, SelectType="select/bogus"))
    with pytest.raises(NotApplied):
        controller.apply(_spec(demo_spec, SelectType="select/bogus"))
    files, note = rollout.boot_files(bad, VERSION, controller.record)
    assert files == good
    assert (
        note == f"slurmctld refused cluster.yaml's configuration before ({FATAL}); "
        "starting on the last configuration it accepted"
    )
    # Another Slurm, or other files: tried.
    assert rollout.boot_files(bad, "slurm 24.11.1", controller.record) == (bad, None)
    other = render(_spec(demo_spec, SelectType="select/linear"))
    assert rollout.boot_files(other, VERSION, controller.record) == (other, None)


def test_nothing_accepted_means_nothing_to_fall_back_on(tmp_path, demo_spec):
    record = rollout.Record(tmp_path / "record.json")
    bad = render(_spec(demo_spec, SelectType="select/bogus"))
    record.refuse(rollout.fingerprint(bad, VERSION), FATAL)
    files, note = rollout.boot_files(bad, VERSION, record)
    assert files == bad
    assert "none was accepted to fall back on; trying it again" in note


def test_an_unreadable_record_is_no_record(tmp_path):
    path = tmp_path / "record.json"
    for junk in ("", "[]", "{", '{"accepted": "x", "refused": 3}'):
        path.write_text(junk)
        assert rollout.Record(path).accepted() is None
        assert rollout.Record(path).refusal("x") is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own the record")
def test_only_a_record_root_wrote_counts(tmp_path, demo_spec):
    """slurmctld's state volume is the slurm user's: what it could write must not become
    the files slurmctld reads as root."""
    path = tmp_path / "record.json"
    record = rollout.Record(path)
    files = render(_spec(demo_spec))
    record.accept({**files, "../../etc/passwd": "root::0:0::/:/bin/sh\n"})
    assert record.accepted() == files  # only Slurm's file names
    os.chown(path, 65534, 65534)  # as if the slurm user had replaced it
    assert record.accepted() is None
    os.chown(path, 0, 0)
    path.chmod(0o620)
    assert record.accepted() is None
    path.chmod(0o600)
    link = tmp_path / "link.json"
    link.symlink_to(path)
    assert rollout.Record(link).accepted() is None
    assert record.accepted() == files


def test_at_start_files_slurmctld_runs_become_accepted(controller, demo_spec):
    controller.apply(_spec(demo_spec))
    demo_spec["partitions"]["gpu"]["maxTime"] = 60
    new = render(_spec(demo_spec))
    rollout.write_files(controller.conf_dir, new)  # what `slonk init` wrote
    assert (
        controller.settle() == "slurmctld runs cluster.yaml's configuration; sent it to the slurmds"
    )
    assert controller.record.accepted() == new
    assert controller.settle() is None


def test_at_start_files_slurmctld_will_not_run_are_taken_back(controller, demo_spec):
    controller.apply(_spec(demo_spec))
    good = rollout.read_files(controller.conf_dir)
    rollout.write_files(controller.conf_dir, render(_spec(demo_spec, SelectType="select/bogus")))
    assert (
        controller.settle() == f"slurmctld refused cluster.yaml's configuration ({FATAL}); "
        "it runs the last configuration it accepted"
    )
    assert rollout.read_files(controller.conf_dir) == good


def test_at_first_start_there_is_nothing_to_take_back(controller, demo_spec):
    rollout.write_files(controller.conf_dir, render(_spec(demo_spec, SelectType="select/bogus")))
    assert (
        controller.settle() == f"slurmctld does not run cluster.yaml's configuration "
        f"({FATAL}) and none was accepted before to fall back on"
    )
    assert controller.record.accepted() is None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0


def test_a_change_waiting_for_slurmctld_is_said_once_and_retried_with_backoff(tmp_path, demo_spec):
    spec_file = tmp_path / "cluster.yaml"
    spec_file.write_text(yaml.safe_dump(demo_spec))
    tries: list[float] = []
    clock = Clock()

    def apply(spec) -> str:
        tries.append(clock.now)
        if len(tries) < 6:
            raise NotNow("slurmctld is not answering")
        return "rewrote slurm.conf"

    follower = Follower(apply, spec_file, interval=1.0, handled=None)
    said = []
    while clock.now < 200:
        line = follower.poll(clock.now)
        if line:
            said.append(line)
        clock.now += 1.0
    assert said == [
        "cluster.yaml change waits for slurmctld, will retry: slurmctld is not answering",
        "applied cluster.yaml change: rewrote slurm.conf",
    ]
    assert [b - a for a, b in itertools.pairwise(tries)] == [2, 4, 8, 16, 32]
    # A new content is tried at once, and said again.
    demo_spec["partitions"]["gpu"]["maxTime"] = 60
    spec_file.write_text(yaml.safe_dump(demo_spec))
    assert follower.poll(clock.now) == "applied cluster.yaml change: rewrote slurm.conf"


def test_refusals_are_said_once(tmp_path, demo_spec):
    spec_file = tmp_path / "cluster.yaml"
    spec_file.write_text("nodepools: 3\n")

    def apply(spec) -> str:
        raise NotApplied(FATAL)

    follower = Follower(apply, spec_file, interval=1.0, handled=None)
    lines = [follower.poll(float(t)) for t in range(5)]
    assert lines[0].startswith(
        f"refused cluster.yaml change, running configuration kept: {spec_file}: "
    )
    assert lines[1:] == [None] * 4
    spec_file.write_text(yaml.safe_dump(demo_spec))
    lines = [follower.poll(float(t)) for t in range(5)]
    assert (
        lines
        == [
            "refused cluster.yaml change, every node keeps the running "
            f"configuration: slurmctld would not run it: {FATAL}"
        ]
        + [None] * 4
    )


def test_what_slurmctld_said_names_the_cause():
    """Lines as Slurm printed them, measured on this machine (22.05 and 24.11.5 alike)."""
    parse = [
        "slurmctld: Processing Reconfiguration Request",
        "slurmctld: error: _parse_next_key: Parsing error at unrecognized key: BogusKey",
        "slurmctld: fatal: Unable to process configuration file",
    ]
    assert _what_it_said(parse) == (
        "error: _parse_next_key: Parsing error at unrecognized "
        "key: BogusKey; fatal: Unable to process configuration file"
    )
    plugin = [
        "slurmctld: error: Could not open job state file /var/spool/slurmctld/job_state",
        "slurmctld: No job state file (/var/spool/slurmctld/job_state.old) to recover",
        "slurmctld: fatal: Can't find plugin for select/bogus",
    ]
    assert _what_it_said(plugin) == FATAL
    # 24.11.5's scontrol reconfigure on a file it cannot parse (slonk drops "scontrol: ").
    scontrol = [
        "error: _parse_next_key: Parsing error at unrecognized key: BogusKey",
        "fatal: Unable to process configuration file",
    ]
    assert _what_it_said(scontrol) == PARSE
    assert _what_it_said(["slurmctld: error: a", "slurmctld: error: b", "info"]) == "error: b"
    assert _what_it_said(["slurmctld: started"]) == ""
    assert _what_it_said(["slurmctld: fatal: a\rb\x1b[2Jc" + "x" * 1000]) == (
        "fatal: a?b?[2Jc" + "x" * 485
    )


def test_run_scripts_use_slonks_paths():
    """The s6 run scripts name paths that slonk.base.paths names too: they must agree."""
    services = paths.rootfs_dir() / "usr/share/slonk/services"
    slurmctld = (services / "slurmctld/run").read_text()
    assert f"-f {paths.SLURMCTLD_CONF_DIR / 'slurm.conf'}\n" in slurmctld
    assert f" {paths.SLURMCTLD_LOG.parent}\n" in (services / "slurmctld/log/run").read_text()
    assert '--conf-server "$SLURM_CONF_SERVER"' in (services / "slurmd/run").read_text()


def test_a_change_between_init_and_the_watchs_start_is_applied(tmp_path, demo_spec):
    """`slonk init` records the content it read; a ConfigMap change that lands before
    config-watch starts (a `helm upgrade` while the pod boots) is still a change to it."""
    spec_file, record = tmp_path / "cluster.yaml", tmp_path / "started-on"
    spec_file.write_text(yaml.safe_dump(demo_spec))
    _, read = read_spec(spec_file)
    record.write_text(read)
    assert handled_last(spec_file, record) == fingerprint(spec_file)  # nothing came between
    demo_spec["partitions"]["gpu"]["maxTime"] = 60
    spec_file.write_text(yaml.safe_dump(demo_spec))
    follower = Follower(
        lambda spec: "rewrote slurm.conf", spec_file, 1.0, handled=handled_last(spec_file, record)
    )
    assert follower.poll(0.0) == "applied cluster.yaml change: rewrote slurm.conf"
    assert follower.poll(1.0) is None
    # A pod whose init recorded nothing takes what is there as what it runs.
    assert handled_last(spec_file, tmp_path / "none") == fingerprint(spec_file)


def _started(apply: Callable[[Any], str], spec_file: Path, record: Path) -> Follower:
    """A Follower as each start of the config-watch task makes it: from the record."""
    return Follower(apply, spec_file, 1.0, handled_last(spec_file, record), record)


def test_a_watch_that_failed_half_way_applies_the_change_when_it_starts_again(tmp_path, demo_spec):
    """The agent starts a failed config-watch again, with a new Follower: it must start from
    what was dealt with last, not from what init read. A cluster.yaml set back to the content
    the pod started on (a test's settings undone, a GitOps revert) whose apply failed was
    otherwise taken as dealt with, and the node kept the reverted change's health plan."""
    spec_file, record = tmp_path / "cluster.yaml", tmp_path / "handled"
    first = yaml.safe_dump(demo_spec)
    spec_file.write_text(first)
    record.write_text(read_spec(spec_file)[1])  # as init records it
    calls = itertools.count()

    def apply(spec) -> str:
        if next(calls) == 1:
            raise OSError(26, "Text file busy")  # half-way: a program slurmd was starting
        return "updated the health plan and job programs"

    watch = _started(apply, spec_file, record)
    demo_spec["partitions"]["gpu"]["maxTime"] = 60
    spec_file.write_text(yaml.safe_dump(demo_spec))
    said = "applied cluster.yaml change: updated the health plan and job programs"
    assert watch.poll(0.0) == said
    spec_file.write_text(first)  # back to what the pod started on
    with pytest.raises(OSError, match="Text file busy"):
        watch.poll(1.0)
    again = _started(apply, spec_file, record)  # the agent's restart of the task
    assert again.poll(2.0) == said
    assert next(calls) == 3
    assert _started(apply, spec_file, record).poll(3.0) is None  # dealt with: no more to do


def test_a_change_that_failed_half_way_is_in_doubt_whatever_comes_next(tmp_path, demo_spec):
    """The other order: B fails half-way, and cluster.yaml is back to the pod's first content
    before the task starts again. The record said "in doubt" meanwhile, so that content is
    applied over what B left, not taken as the one the node runs."""
    spec_file, record = tmp_path / "cluster.yaml", tmp_path / "handled"
    first = yaml.safe_dump(demo_spec)
    spec_file.write_text(first)
    record.write_text(read_spec(spec_file)[1])
    calls = itertools.count()

    def apply(spec) -> str:
        if next(calls) == 0:
            raise OSError(28, "No space left on device")  # half-way through B
        return "updated the health plan and job programs"

    demo_spec["partitions"]["gpu"]["maxTime"] = 60
    spec_file.write_text(yaml.safe_dump(demo_spec))
    with pytest.raises(OSError):
        _started(apply, spec_file, record).poll(0.0)
    assert record.read_text() == IN_DOUBT
    spec_file.write_text(first)  # back, during the agent's back-off
    said = "applied cluster.yaml change: updated the health plan and job programs"
    assert _started(apply, spec_file, record).poll(1.0) == said
    assert record.read_text() == fingerprint(spec_file)


def test_what_is_recorded_is_the_content_applied(tmp_path, demo_spec):
    """The file is read once a look: a swap while the change is applied is the next change,
    never recorded under the one applied."""
    spec_file, record = tmp_path / "cluster.yaml", tmp_path / "handled"
    demo_spec["partitions"]["gpu"]["maxTime"] = 60
    spec_file.write_text(yaml.safe_dump(demo_spec))
    applied = fingerprint(spec_file)
    demo_spec["partitions"]["gpu"]["maxTime"] = 90
    swapped = yaml.safe_dump(demo_spec)
    times = []

    def apply(spec) -> str:
        times.append(next(p.max_time for p in spec.partitions if p.name == "gpu"))
        if len(times) == 1:
            spec_file.write_text(swapped)  # kubelet swaps while the first is applied
        return "rewrote slurm.conf"

    follower = Follower(apply, spec_file, 1.0, handled=None, record=record)
    assert follower.poll(0.0) and record.read_text() == applied
    assert follower.poll(1.0) == "applied cluster.yaml change: rewrote slurm.conf"
    assert times == ["60", "90"]


def test_a_record_that_cannot_be_written_costs_one_more_apply_not_the_task(tmp_path, demo_spec):
    spec_file = tmp_path / "cluster.yaml"
    spec_file.write_text(yaml.safe_dump(demo_spec))
    unwritable = tmp_path / "gone" / "handled"
    follower = Follower(lambda spec: "rewrote slurm.conf", spec_file, 1.0, handled="old",
                        record=unwritable)  # fmt: skip
    said = follower.poll(0.0)
    assert said.startswith("applied cluster.yaml change: rewrote slurm.conf; could not record")
    assert follower.poll(1.0) is None  # dealt with, for this watch


def _pair(tmp_path: Path) -> tuple[Controller, Controller]:
    """A primary in control and its backup in standby (values controller.backup): each pod's
    files of its own, one record on the state volume both mount."""
    record = rollout.Record(tmp_path / "record.json")
    primary, standby = tmp_path / "primary", tmp_path / "standby"
    return (
        Controller(primary, record, StandIn(primary), in_control=lambda spec: True),
        Controller(standby, record, StandIn(standby), in_control=lambda spec: False),
    )


def test_a_standby_takes_only_what_the_controller_in_control_runs(tmp_path, demo_spec):
    primary, standby = _pair(tmp_path)
    primary.apply(_spec(demo_spec))
    demo_spec["partitions"]["gpu"]["maxTime"] = 60
    with pytest.raises(NotNow, match="the slurmctld in control has not run it yet"):
        standby.apply(_spec(demo_spec))  # seen first by the standby: it waits
    assert not (standby.conf_dir / "slurm.conf").exists()
    primary.apply(_spec(demo_spec))
    assert standby.apply(_spec(demo_spec)) == FOLLOWED
    assert rollout.read_files(standby.conf_dir) == rollout.read_files(primary.conf_dir)
    assert standby.daemon.calls == []  # it reads them when it takes control
    bogus = _spec(demo_spec, SelectType="select/bogus")
    with pytest.raises(NotApplied):
        primary.apply(bogus)
    with pytest.raises(NotApplied, match="refused this configuration before"):
        standby.apply(bogus)
    assert rollout.read_files(standby.conf_dir) == rollout.read_files(primary.conf_dir)


def test_a_standby_takes_what_the_controller_in_control_accepted(tmp_path, demo_spec):
    """At start (files init wrote, which the one in control may never run) and after: a
    topology the syncer applied in the other pod changes no cluster.yaml, the record alone."""
    primary, standby = _pair(tmp_path)
    primary.apply(_spec(demo_spec))
    accepted = rollout.read_files(primary.conf_dir)
    spec = _spec(demo_spec, MaxJobCount=5000)  # which the one in control has not run
    rollout.write_files(standby.conf_dir, render(spec))  # what `slonk init` wrote
    assert standby.settle(spec) == FOLLOWED
    assert rollout.read_files(standby.conf_dir) == accepted == primary.record.accepted()
    assert standby.follow(spec) is None  # nothing new
    demo_spec["nodepools"]["cpu"]["replicas"] = 3  # as a new topology would, in the record
    primary.apply(_spec(demo_spec))
    assert standby.follow(_spec(demo_spec)) == FOLLOWED
    assert rollout.read_files(standby.conf_dir) == rollout.read_files(primary.conf_dir)
    assert primary.follow(_spec(demo_spec)) is None  # the one in control follows nobody
    assert standby.daemon.calls == ["started"]  # waited for at start; reads files at takeover


def _update_many(path: str, which: str, times: int) -> None:
    record = rollout.Record(Path(path))
    for i in range(times):
        if which == "accept":
            record.accept({"slurm.conf": f"# {i}\n"})
        else:
            record.refuse(f"key-{i}", "said no")


def test_two_writers_of_the_record_lose_neither_update(tmp_path):
    """The backup controller's pod shares the record: an accept and a refuse written at
    once both stay (each is a read, a change and a replace, under one lock)."""
    import multiprocessing

    path = str(tmp_path / "record.json")
    writers = [
        multiprocessing.Process(target=_update_many, args=(path, which, 200))
        for which in ("accept", "refuse")
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
        assert writer.exitcode == 0
    record = rollout.Record(Path(path))
    assert record.accepted() == {"slurm.conf": "# 199\n"}
    assert record.refusal("key-199") == "said no"
