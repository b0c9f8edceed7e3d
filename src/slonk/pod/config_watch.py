"""config-watch (a task of `slonk agent`): follow cluster.yaml, each pod for what is its own.

kubelet swaps a mounted ConfigMap atomically (its `..data` symlink), so reading the file
gives either the old or the new document, never half of one; a content hash tells a change.
The swap is a rename in the mounted directory, which is what is watched (slonk.agent.changes;
local mode's projection swaps the same way); a look every RECHECK_SECONDS (the waiter's)
stays as a safety net. No server is asked: each pod reads its own mount, so a change reaches
N pods at no cost to anyone (the controller's one reconfigure fans out through slurmctld).

Slurm runs configless: the controller renders the Slurm configuration and slurmctld is its
only reader; every slurmd and client fetches what slurmctld runs. So the controller alone
applies a change: it writes the files and has slurmctld run them, by `scontrol reconfigure`
or, for the few settings only a restart applies, by a restart (slonk.slurm.slurmctld says which);
if slurmctld will not run them, it puts the previous ones back, says once what slurmctld
said, and never tries those files again. Only files slurmctld runs are sent to the slurmds.
A worker follows cluster.yaml for its own health plan and job programs.
"""

from __future__ import annotations

import fcntl
import functools
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from slonk.agent.changes import RECHECK_SECONDS, Waiter
from slonk.base import paths
from slonk.base.files import write_atomically
from slonk.base.identity import pod_name
from slonk.config import placement
from slonk.config.spec import ClusterSpec, SpecError, load_spec, spec_of
from slonk.config.spec import fingerprint as spec_fingerprint
from slonk.slurm import control, rollout
from slonk.slurm.slurmctld import Refused, Slurmctld, needs_restart

MAX_RETRY_SECONDS = 60.0
# Where inotify is unavailable: as often as before inotify.
POLL_SECONDS = 1.0


class NotApplied(RuntimeError):
    """slurmctld refused the configuration; the previous one runs everywhere."""


# What a standby says when its files became the record's (values controller.backup).
FOLLOWED = "this standby slurmctld's files follow what the one in control runs"
# How often a standby looks at the record: a topology the one in control applied reaches it
# within this (it reads its files when it takes control).
STANDBY_FOLLOW_SECONDS = 5.0


class NotNow(RuntimeError):
    """slurmctld is not answering; nothing was changed, try again later."""


def log(message: str) -> None:
    print(f"slonk watch-config: {message}", file=sys.stderr, flush=True)


def fingerprint(path: Path) -> str | None:
    try:
        return spec_fingerprint(path.read_bytes())
    except OSError:
        return None


def handled_last(spec_path: Path, record: Path = paths.SPEC_HANDLED) -> str | None:
    """The content of cluster.yaml this pod dealt with last, as recorded: what `slonk init`
    read, then what each config-watch applied or refused (a change between init and this
    watch's start, or one a failed watch left half applied, is still a change), or what is
    there now for a pod whose init recorded nothing."""
    try:
        return record.read_text().strip()
    except OSError:
        return fingerprint(spec_path)


# In the directory of the files it guards: every writer of them takes it (rollout reads the
# config files by name only).
CONFIG_LOCK = ".slonk.lock"


@dataclass
class Controller:
    """Applies a configuration to slurmctld, or keeps the one it runs."""

    conf_dir: Path = paths.SLURMCTLD_CONF_DIR
    record: rollout.Record = field(default_factory=lambda: rollout.Record(paths.ROLLOUT_RECORD))
    daemon: Slurmctld = field(default_factory=Slurmctld)
    in_control: Callable[[ClusterSpec], bool] = lambda spec: control.in_control(spec, pod_name())

    @functools.cached_property
    def version(self) -> str:
        return self.daemon.version()

    def _take_back(self, key: str, old: rollout.Files, reason: str) -> str:
        """slurmctld will not run the live files: the previous ones back, slurmctld on them,
        and these files never tried again. Returns what to say."""
        rollout.write_files(self.conf_dir, old)
        self.record.refuse(key, reason)
        # scontrol may have refused them before slurmctld saw them: it still runs the old.
        if not self.daemon.answers() and not self.daemon.recover():
            reason += "; slurmctld does not answer on the previous configuration either"
        return reason

    def apply(self, spec: ClusterSpec | Callable[[], ClusterSpec]) -> str:
        """Render and run the files; one caller at a time (config-watch, the syncer's
        topology). A loader is called under the lock: the syncer applies cluster.yaml as it
        is then, never a copy config-watch has replaced meanwhile."""
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        with open(self.conf_dir / CONFIG_LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return self._apply(spec if isinstance(spec, ClusterSpec) else spec())

    def _apply(self, spec: ClusterSpec) -> str:
        from slonk.config.render import render  # the controller's alone: Jinja is 30 ms

        new, old = render(spec, placement.load()), rollout.read_files(self.conf_dir)
        if new == old:
            return "no change to the Slurm configuration"
        key = rollout.fingerprint(new, self.version)
        refused = self.record.refusal(key)
        if refused is not None:
            raise NotApplied(f"slurmctld refused this configuration before ({refused})")
        if not self.in_control(spec):
            return self._follow(new)
        answers = self.daemon.answers()
        # Not answering on files it never accepted, it has nothing to lose: a start decides.
        if not answers and old == self.record.accepted():
            raise NotNow("slurmctld is not answering")
        restart = needs_restart(old.get("slurm.conf", ""), new["slurm.conf"])
        rollout.write_files(self.conf_dir, new)
        try:
            if answers and not restart:
                sent = self.daemon.reconfigure()
            else:
                self.daemon.restart()
                sent = self.daemon.push()
        except Refused as err:
            raise NotApplied(self._take_back(key, old, str(err))) from None
        self.record.accept(new)
        changed = ", ".join(sorted(n for n in new if new[n] != old.get(n)))
        return f"rewrote {changed}; slurmctld runs it; {sent}"

    def _follow(self, new: rollout.Files) -> str:
        """A standby slurmctld (values controller.backup) reads its files when it takes
        control: they are what the slurmctld in control accepted (the record, on the state
        volume both share), never files it has not run."""
        if new != self.record.accepted():
            raise NotNow("the slurmctld in control has not run it yet")
        rollout.write_files(self.conf_dir, new)
        return FOLLOWED

    def follow(self, spec: ClusterSpec) -> str | None:
        """A standby's files, made the record's again when the one in control accepted others
        (a topology the syncer applied, files init wrote that it then refused); what to say,
        or None when there was nothing to do."""
        accepted = self.record.accepted()
        if accepted is None or accepted == rollout.read_files(self.conf_dir):
            return None
        if self.in_control(spec):
            return None
        rollout.write_files(self.conf_dir, accepted)
        return FOLLOWED

    def settle(self, spec: ClusterSpec | None = None) -> str | None:
        """At start: slurmctld was started on what `slonk init` wrote. Files it has not
        accepted before become accepted once it answers (in control: see _follow), or are
        taken back if it will not run them."""
        self.daemon.keep_up()  # a config-watch that died half-way may have left it at -o
        live, accepted = rollout.read_files(self.conf_dir), self.record.accepted()
        if live == accepted:
            return None
        try:
            self.daemon.started()
        except Refused as err:
            if accepted is None:
                self.daemon.keep_up()
                return (
                    f"slurmctld does not run cluster.yaml's configuration ({err}) "
                    "and none was accepted before to fall back on"
                )
            said = self._take_back(rollout.fingerprint(live, self.version), accepted, str(err))
            return (
                f"slurmctld refused cluster.yaml's configuration ({said}); "
                "it runs the last configuration it accepted"
            )
        if spec is not None and not self.in_control(spec):
            # In standby it runs nothing: it takes the files the one in control accepted.
            return self.follow(spec) or "standby slurmctld runs the accepted configuration"
        self.record.accept(live)
        if accepted is None:
            return "slurmctld runs cluster.yaml's configuration"
        return f"slurmctld runs cluster.yaml's configuration; {self.daemon.push()}"


def apply_worker(spec: ClusterSpec) -> str:
    from slonk.pod import job_programs  # a controller needs none of the health and hooks code

    return job_programs.update_node_programs(spec, pod_name())


# What the record holds while a change is being applied: no content's fingerprint, so that a
# watch that dies half-way (an error, the agent killed) applies what it finds when it starts
# again, whatever that is.
IN_DOUBT = ""


@dataclass
class Follower:
    """Applies each new content of cluster.yaml once. Only an unanswering slurmctld makes a
    change wait: it is tried again with a doubling delay (capped), and said once."""

    apply: Callable[[ClusterSpec], str]
    spec_path: Path
    interval: float
    handled: str | None  # the content last dealt with (at start: the record's)
    record: Path | None = None  # where `handled` is kept for the next watch (handled_last)
    waiting: str | None = None
    delay: float = 0.0
    retry_at: float = 0.0

    def poll(self, now: float) -> str | None:
        """One look at cluster.yaml; returns the line to log, if any. The content is read
        once: what is applied is what is recorded, even if the file changes meanwhile."""
        try:
            content = self.spec_path.read_bytes()
        except OSError:
            return None
        current = spec_fingerprint(content)
        if current == self.handled or (current == self.waiting and now < self.retry_at):
            return None
        unkept = self._keep(IN_DOUBT)
        said = None
        try:
            said = f"applied cluster.yaml change: {self.apply(spec_of(content, self.spec_path))}"
        except SpecError as err:
            # Invalid content stays invalid: refuse it once, keep the running configuration.
            said = f"refused cluster.yaml change, running configuration kept: {err}"
        except NotApplied as err:
            said = (
                "refused cluster.yaml change, every node keeps the running configuration: "
                f"slurmctld would not run it: {err}"
            )
        except NotNow as err:
            if self.waiting != current:
                said = f"cluster.yaml change waits for slurmctld, will retry: {err}"
                self.waiting, self.delay = current, self.interval
            self.delay = min(self.delay * 2, MAX_RETRY_SECONDS)
            self.retry_at = now + self.delay
            return said
        self.handled, self.waiting = current, None
        unkept = self._keep(current) or unkept
        return f"{said}; {unkept}" if unkept else said

    def _keep(self, content: str) -> str | None:
        """Record `content` as dealt with for the next watch; what went wrong, if anything (a
        record that cannot be written costs a watch started again one more apply, no more)."""
        if self.record is None:
            return None
        try:
            write_atomically(self.record, content)
        except OSError as err:
            return f"could not record it in {self.record}: {err.strerror}"
        return None


def watch(
    role: str,
    stop: threading.Event,
    changes: Waiter,
    spec_path: Path = paths.CLUSTER_SPEC,
    interval: float = POLL_SECONDS,
) -> None:
    """Apply each change of cluster.yaml until `stop` is set; `changes` wakes on its directory."""
    apply: Callable[[ClusterSpec], str] = apply_worker
    # A controller with a backup, which may be in standby, and its spec (the controllers are
    # fixed for the pod's life).
    standby: tuple[Controller, ClusterSpec] | None = None
    if role == "controller":
        controller = Controller()
        try:
            spec: ClusterSpec | None = load_spec(spec_path)
        except SpecError:
            spec = None  # init read it; a change since is the follower's to refuse
        settled = controller.settle(spec)
        if settled:
            log(settled)
        apply = controller.apply
        if spec is not None and spec.backup_controller is not None:
            standby = controller, spec
    handled = handled_last(spec_path)
    if standby is not None and not standby[0].in_control(standby[1]):
        # A standby took the record's files at start, not what init read: that content is
        # applied (or followed) later, once the one in control ran it or this one holds
        # control, instead of counting as dealt with.
        handled = None
    follower = Follower(apply, spec_path, interval, handled=handled, record=paths.SPEC_HANDLED)
    log(f"watching {changes.describe()}")
    while not stop.is_set():
        said = follower.poll(time.monotonic())  # first: a change since `slonk init` read it
        if said:
            log(said)
        timeout = RECHECK_SECONDS
        if standby is not None:
            timeout = STANDBY_FOLLOW_SECONDS
            said = standby[0].follow(standby[1])
            if said:
                log(said)
        if follower.waiting is not None:  # slurmctld did not answer: try again on time
            timeout = min(timeout, follower.retry_at - time.monotonic())
        changes.wait(timeout)
