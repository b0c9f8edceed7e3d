"""Health checks on a local cluster, by fault injection into one worker: it is drained with
the check's reason and no job lands on it; healed, it returns. A person's drain outlives every
check and recycle; a node failing its boot checks is recycled, then quarantined."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slonk.align.recycle import HISTORY
from slonk.base.paths import HEALTH_PLAN, JOB_TMP_BASE
from slonk.config.model import HealthSettings, default_of
from slonk.config.spec import HEALTH_CHECKS
from slonk.health.drains import LOG as HEALTH_LOG
from slonk.local.cluster import Cluster

from ..support.cluster import SCRATCH, SESSION_RECYCLE, LocalCluster, slonk, wait_for
from ..support.scrape import scrape, values
from ..support.users import bystander

BAD, GOOD = "slonk-cpu-1", "slonk-cpu-0"
CONTROLLER = "slonk-controller-0"
ECC = "slonk:gpu: GPU 1 (00000000:2A:00.0): 2 uncorrectable ECC errors"


class Faults:
    """Breaks a worker the ways real nodes break, and undoes each afterwards."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.undo: list[tuple[str, str]] = []

    def inject(self, pod: str, command: str, undo: str) -> None:
        self.undo.append((pod, undo))
        self.cluster.pod(pod).check_output(command)

    def read_only_home(self, pod: str = BAD) -> None:
        self.inject(pod, "mount -o remount,bind,ro /home", "mount -o remount,bind,rw /home")

    def full_scratch(self, pod: str = BAD) -> None:
        # A small scratch filesystem in the pod, filled up.
        self.inject(
            pod,
            f"mount -t tmpfs -o size=4m scratch {SCRATCH} && fallocate -l 4m {SCRATCH}/fill",
            f"umount {SCRATCH}",
        )

    def small_disk(self, pod: str = BAD) -> None:
        """A small file system as the node's scratch and under its jobs' own /tmp, as a real
        worker container's disk holds both (job_container/tmpfs keeps a job's /tmp in a
        directory under its BasePath). The jobs' directory is private, as Slurm makes it:
        each job's mount namespace is kept by a bind onto a file there."""
        jobs = JOB_TMP_BASE / pod
        self.inject(
            pod, f"mount -t tmpfs -o size=4m,mode=1777 scratch {SCRATCH}", f"umount -l {SCRATCH}"
        )
        self.inject(
            pod,
            f"mkdir -m 700 {SCRATCH}/.jobs && mount --bind {SCRATCH}/.jobs {jobs}"
            f" && mount --make-private {jobs}",
            f"umount -l {jobs}",
        )

    def gpu(self, scenario: str, pod: str = BAD, via: str | None = None) -> None:
        """The fake nvidia-smi's state lives in the shared /home: it outlives pod restarts,
        and is written from `via` (default: `pod`) while `pod` is stopped."""
        state = f"/home/.fake-gpu/{pod}"
        self.inject(
            via or pod, f"mkdir -p /home/.fake-gpu && echo {scenario} > {state}", f"rm -f {state}"
        )

    def heal(self) -> None:
        while self.undo:
            pod, command = self.undo.pop()
            self.cluster.pod(pod).run(command)


@pytest.fixture
def faults(healthy: LocalCluster) -> Iterator[Faults]:
    injected = Faults(healthy)
    try:
        yield injected
    finally:
        injected.heal()
        healthy.recycle_as_the_session_does()
        wait_for("quarantines and maintenance lifted", lambda: _lift_drains(healthy))


def _lift_drains(cluster: LocalCluster) -> bool:
    """One pass of what the person replacing a quarantined machine does (and of ending a
    test's maintenance drain): whether none was left. Passes repeat until one finds none: the
    recycle loop may still run a test's settings for a moment after `upgrade`."""
    controller = cluster.pod(CONTROLLER)
    found = False
    for node, (_, reason) in cluster.nodes().items():
        if reason.startswith("slonk:quarantine"):
            # Whoever replaces the machine lifts its taint too: until then Kubernetes places
            # no new pod there (the fake API server keeps such a pod Pending).
            with contextlib.suppress(AssertionError):  # not tainted (yet): nothing to lift
                cluster.kubectl("taint", "node", f"local-{node}", "slonk.io/quarantine-")
        if reason.startswith("slonk:quarantine") or reason == "maintenance":
            controller.run(f"scontrol update nodename={node} state=resume")
            found = True
    return not found


def _drained_with(cluster: LocalCluster, node: str, reason: str) -> None:
    wait_for(
        f"{node} drained for {reason!r}",
        lambda: (
            cluster.nodes()[node][1].startswith(reason)
            and "drain" in cluster.nodes()[node][0].split("+")
        ),
    )


def _health_log_offset(cluster: LocalCluster, pod: str) -> int:
    """Where the pod's health log ends now (it lives in the pod's own layer: one pod's)."""
    out = cluster.pod(pod).run(f"stat -c %s {HEALTH_LOG}")
    return int(out.stdout) if out.rc == 0 else 0


def _health_log(cluster: LocalCluster, pod: str, since: int) -> str:
    """What the pod's health runs logged past byte offset `since`."""
    out = cluster.pod(pod).run(f"tail -c +{since + 1} {HEALTH_LOG}")
    return out.stdout if out.rc == 0 else ""


def _wait_health_logged(
    cluster: LocalCluster, pod: str, since: int, what: str, *fragments: str
) -> None:
    """Until one line the pod's health runs logged past `since` holds every fragment."""

    def logged() -> bool:
        return any(
            all(f in line for f in fragments)
            for line in _health_log(cluster, pod, since).splitlines()
        )

    try:
        wait_for(what, logged)
    except AssertionError as err:
        raise AssertionError(f"{err}; {pod} logged:\n{_health_log(cluster, pod, since)}") from None


def _health_run_by_hand(cluster: LocalCluster, pod: str) -> str:
    """A health run as slurmd's interval runs do it, here and now: a passing check that leaves
    a node be logs nothing, so its say is read from its output."""
    return cluster.pod(pod).run("slonk health run --phase interval --drain").stdout


def _recycle_pass(cluster: LocalCluster) -> None:
    """Returns once the recycle loop has made a whole pass that began after the call: it
    saves its history (a new file) after every pass, so the second save seen from here ends
    a pass begun after the first."""
    controller = cluster.pod(CONTROLLER)

    def saved() -> str:
        return controller.run(f"stat -c '%i %y' {shlex.quote(str(HISTORY))}").stdout

    for _ in range(2):
        before = saved()
        wait_for("a pass of the recycle loop", lambda before=before: saved() != before)


def _deletes_offset(cluster: LocalCluster) -> int:
    return (cluster.state_dir / "apiserver" / "log").stat().st_size


def _deletes(cluster: LocalCluster, pod: str, since: int) -> int:
    """Pod deletions (recycles) the fake API server logged past byte offset `since`."""
    with open(cluster.state_dir / "apiserver" / "log", "rb") as log:
        log.seek(since)
        text = log.read().decode(errors="replace")
    return text.count(f'DELETE /api/v1/namespaces/default/pods/{pod} HTTP/1.1" 200')


def _in_controller(cluster: LocalCluster, *command: str) -> str:
    """A command in the controller pod as an operator runs it: `slonk local exec`."""
    state = ("--state-dir", str(cluster.state_dir))
    return slonk("local", "exec", *state, CONTROLLER, "--", *command).stdout


def _hosts_of_new_jobs(cluster: LocalCluster, count: int) -> set[str]:
    jobs = [
        cluster.submit("--output=/dev/null", "--wrap", "hostname > $HOME/ran-$SLURM_JOB_ID")
        for _ in range(count)
    ]
    wait_for("the jobs to finish", lambda: not set(jobs) & set(cluster.jobs()))
    user = cluster.user("demo")
    return {user.check_output(f"cat ran-{job}").strip() for job in jobs}


@pytest.mark.parametrize(
    ("inject", "reason"),
    [
        pytest.param(Faults.read_only_home, "slonk:storage: /home is mounted read-only", id="home"),
        pytest.param(
            Faults.full_scratch, f"slonk:scratch: {SCRATCH} 0.0% free, below 5%", id="scratch"
        ),
        pytest.param(lambda f: f.gpu("ecc"), ECC, id="gpu"),
    ],
)
def test_a_fault_drains_its_node_and_healing_returns_it(faults: Faults, inject, reason: str):
    offset = _health_log_offset(faults.cluster, BAD)
    inject(faults)
    _drained_with(faults.cluster, BAD, reason)
    assert _hosts_of_new_jobs(faults.cluster, 4) == {GOOD}
    faults.heal()
    # The health run logs the resume once Slurm took it.
    _wait_health_logged(
        faults.cluster, BAD, offset, f"{BAD} resumed by its health check", f"resumed (was: {reason}"
    )
    faults.cluster.wait_idle()


def _job_held_on_bad(cluster: LocalCluster) -> str:
    """A job running on BAD until _release: a fault made meanwhile surely comes while it runs.
    It writes `survived-<job>` in demo's home as it ends."""
    return cluster.start(
        "until [ -e $HOME/release-$SLURM_JOB_ID ]; do sleep 0.2; done; "
        "echo done > $HOME/survived-$SLURM_JOB_ID",
        f"--nodelist={BAD}",
        "--output=/dev/null",
    )


def _release(cluster: LocalCluster, job: str) -> None:
    cluster.user("demo").check_output(f"touch release-{job}")
    wait_for(f"job {job} to finish", lambda: job not in cluster.jobs())
    assert cluster.user("demo").check_output(f"cat survived-{job}").strip() == "done"


def test_a_job_running_when_a_fault_appears_finishes(faults: Faults):
    cluster = faults.cluster
    job = _job_held_on_bad(cluster)
    faults.gpu("xid")
    _drained_with(cluster, BAD, "slonk:gpu: XID 79 on PCI:0000:2a:00")
    # no new jobs, this one keeps running
    assert cluster.nodes()[BAD][0] in ("mixed+drain", "allocated+drain")
    assert cluster.jobs().get(job) == "RUNNING"
    _release(cluster, job)


def _watch_values(cluster: LocalCluster, seconds: int, phases: dict[str, list[str]]) -> None:
    """Upgrade to this watch period and these checks' phases. Upgrades add up (a later one
    keeps what an earlier one set): a test that sets them sets them back."""
    values = cluster.state_dir.parent / "watch.yaml"
    checks = {name: {"phases": phases} for name, phases in phases.items()}
    values.write_text(json.dumps({"health": {"watchSeconds": seconds, "checks": checks}}))
    cluster.slonk("upgrade", "-f", str(values))

    def planned(pod: str) -> bool:  # `upgrade` returns on the controller's word, not theirs
        plan = json.loads(cluster.pod(pod).check_output(f"cat {HEALTH_PLAN}"))
        return plan["watch_seconds"] == seconds and all(
            plan["checks"][name]["phases"] == wanted for name, wanted in phases.items()
        )

    try:
        wait_for("every worker's new health plan", lambda: all(map(planned, (GOOD, BAD))))
    except AssertionError as err:  # what each worker's config-watch said, for whoever reads it
        words = ("config", "inotify", "failed (")
        said = {p: [ln for ln in cluster.log(p).splitlines() if any(w in ln for w in words)][-5:]
                for p in (GOOD, BAD)}  # fmt: skip
        raise AssertionError(f"{err}; config-watch said: {said}") from None


@pytest.fixture
def watch_only(faults: Faults) -> Iterator[Faults]:
    """Only the workers' agents look at storage and GPUs (their watch, every second): those
    checks are in no other phase. (Slurm's interval is left alone: lengthened to an hour and
    shortened again, it ran no check for the next minute here.)"""
    watched = ("storage", "gpu")
    _watch_values(faults.cluster, 1, {name: ["watch"] for name in watched})
    yield faults
    faults.heal()
    defaults = {name: list(HEALTH_CHECKS[name].phases) for name in watched}
    _watch_values(faults.cluster, default_of(HealthSettings, "watch_seconds"), defaults)


def _watched_since(cluster: LocalCluster, pod: str, since: float) -> bool:
    """Whether a watch round that began after `since` (seconds since the epoch) ended: each
    saves its results with when every check ended."""
    out = cluster.pod(pod).run("cat /run/slonk/health/results-watch.json")
    return out.rc == 0 and min(r["time"] - r["seconds"] for r in json.loads(out.stdout)) > since


def test_the_agents_watch_drains_a_faulty_node_and_resumes_it_once_healed(watch_only: Faults):
    cluster = watch_only.cluster
    offset = _health_log_offset(cluster, BAD)
    watch_only.read_only_home()
    reason = "slonk:storage: /home is mounted read-only"
    _drained_with(cluster, BAD, reason)
    _wait_health_logged(cluster, BAD, offset, "the watch's drain", f"watch: {reason}", "drained")
    assert _hosts_of_new_jobs(cluster, 2) == {GOOD}
    watch_only.heal()
    _wait_health_logged(
        cluster, BAD, offset, "the watch's resume", "watch: all passed", f"resumed (was: {reason}"
    )
    cluster.wait_idle()


def test_gpu_memory_left_behind_drains_the_node_once_its_jobs_have_ended(watch_only: Faults):
    cluster = watch_only.cluster
    job = _job_held_on_bad(cluster)
    injected = time.time()
    watch_only.gpu("leftover")  # while a job runs, GPU memory in use is the job's
    wait_for("a watch round after", lambda: _watched_since(cluster, BAD, injected))
    assert cluster.nodes()[BAD][0] in ("mixed", "allocated")  # not drained
    _release(cluster, job)
    _drained_with(cluster, BAD, "slonk:gpu: GPU 0 (00000000:18:00.0): 40960 MiB still in use")


SHARED = "/srv/shared"  # in each worker, a small file system standing for a shared one


def test_a_user_filling_a_shared_file_system_drains_one_node_and_recycles_none(faults: Faults):
    """demo uses up the inodes of a file system every worker shares: the storage check
    fails on both nodes at once. One node drains (its share, at least one), the other stays
    in service and says why, no node is recycled, and another user's jobs keep running."""
    cluster = faults.cluster
    victim = bystander(cluster)  # whose jobs the attacker (demo) must not stop
    workers = (GOOD, BAD)
    for pod in workers:
        faults.inject(
            pod,
            f"mkdir -p {SHARED} && mount -t tmpfs -o size=1m,nr_inodes=64,mode=1777 x {SHARED}",
            f"umount -l {SHARED}",
        )
    offsets = {pod: _health_log_offset(cluster, pod) for pod in workers}
    started = {pod: cluster.slurmd_started(pod) for pod in workers}
    controller_log = cluster.log_offset(CONTROLLER)
    values = cluster.state_dir.parent / "shared-storage.yaml"
    values.write_text(json.dumps({"health": {
        "watchSeconds": 1,
        "checks": {"storage": {"phases": ["watch"], "paths": ["/home", SHARED]}},
        "recycle": {"idleSeconds": 1, "periodSeconds": 1},
    }}))  # fmt: skip
    cluster.slonk("upgrade", "-f", str(values))
    try:
        fill = f"i=0; while touch {SHARED}/$(hostname).$i 2>/dev/null; do i=$((i+1)); done"
        cluster.user("demo").check_output(f"srun -N2 --nodelist={GOOD},{BAD} sh -c {fill!r}")

        def one_drained() -> str | None:
            drained = [
                n for n in workers
                if cluster.nodes()[n][1].startswith("slonk:storage:")
                and "drain" in cluster.nodes()[n][0].split("+")
            ]  # fmt: skip
            return drained[0] if len(drained) == 1 else None

        # Each node decides alone, and the first to drain is for a moment the only one: the
        # outcome is read once the spared node has given its word (both may have drained
        # before one steps back).
        def spared_node() -> str | None:
            said = [p for p in workers if "not drained for slonk:storage" in _health_log(
                cluster, p, offsets[p])]  # fmt: skip
            return said[0] if len(said) == 1 else None

        spared = wait_for("one node's word that it stays in service", spared_node)
        (drained,) = set(workers) - {spared}
        wait_for("the other node drained for storage", lambda: one_drained() == drained)
        wait_for(
            "the recycle loop to leave the drained node",
            lambda: f"not recycling {drained}" in cluster.log(CONTROLLER, controller_log),
        )
        assert one_drained() == drained
        assert {pod: cluster.slurmd_started(pod) for pod in workers} == started  # no new pod
        assert "recycled" not in cluster.log(CONTROLLER, controller_log)
        # Another user's job runs on the node left in service.
        ran = cluster.user(victim).check_output(f"srun --nodelist={spared} hostname").strip()
        assert ran == spared
        # The files go (here each pod has its own file system, and no job lands on the drained
        # node: root deletes them, as demo would on a shared one): storage passes, and the node
        # comes back. Nothing outlasts the files.
        for pod in workers:
            cluster.pod(pod).check_output(f"find {SHARED} -mindepth 1 -delete")
        _wait_health_logged(
            cluster, drained, offsets[drained], "the drained node's resume", "resumed (was: slonk"
        )
        assert "drain" not in cluster.nodes()[drained][0].split("+")
    finally:
        _shared_storage_undone(cluster, values, workers)


def test_a_users_job_filling_scratch_drains_nothing_and_leaves_nothing(faults: Faults):
    """demo's job fills the node's disk, through its own /tmp and the node's scratch (one small
    file system for both, as a real worker container's disk is; its /dev/shm is its own, see
    test_local_resources) and leaves a daemon running out of its process tree: while it runs,
    the space is the job's; as it ends, slurmstepd removes its /tmp and its Epilog ends the
    daemon and removes what demo left, so no watch round drains the node, and another user's
    job runs there."""
    cluster = faults.cluster
    victim = bystander(cluster)  # whose jobs the attacker (demo) must not stop
    faults.small_disk(BAD)
    job = cluster.submit(
        f"--nodelist={BAD}",
        "--output=/dev/null",
        "--wrap",
        f"fallocate -l 2m /tmp/mine; fallocate -l 2m {SCRATCH}/mine; "
        "head -c 1M /dev/zero > /dev/shm/mine; "
        "setsid -f sleep 3600 </dev/null >/dev/null 2>&1; "  # escapes the job (no cgroup here)
        "until [ -e $HOME/release-$SLURM_JOB_ID ]; do sleep 0.2; done",
    )
    wait_for("the job to fill the disk", lambda: _free_percent(cluster, BAD) < 5)
    filled = time.time()
    wait_for("a watch round while it runs", lambda: _watched_since(cluster, BAD, filled))
    assert "drain" not in cluster.nodes()[BAD][0].split("+")
    cluster.user("demo").check_output(f"touch release-{job}")
    wait_for(f"job {job} to end", lambda: job not in cluster.jobs())
    ended = time.time()
    wait_for("a watch round after it", lambda: _watched_since(cluster, BAD, ended))
    assert "drain" not in cluster.nodes()[BAD][0].split("+"), cluster.nodes()[BAD]
    pod = cluster.pod(BAD)
    assert _free_percent(cluster, BAD) == 100
    assert pod.check_output(f"find {SCRATCH} /dev/shm -mindepth 1 -user demo") == ""
    assert pod.run("pgrep -u demo").rc == 1, pod.run("ps -fu demo").stdout
    uid = pod.check_output("id -u demo").strip()
    log = pod.run(f"cat /var/log/slonk/hooks/{job}.log")
    # Whoever cleared, nothing is left (above). Mostly the Epilog did, and said so; but a
    # watch round that comes after the job's last step and before its Epilog finds no job on
    # the node and clears first (check_scratch, as for anyone whose Epilog did not), and the
    # Epilog, finding nothing, writes no log (seen once in five clean-clone runs).
    if log.rc == 0:
        said = log.stdout
        # The daemon is gone either way: ended by the Epilog ("processes: ended N uid U left
        # on the node") or gone before it looked (seen once: the scratch line alone).
        assert "still there" not in said, said
        removed = re.search(rf"scratch: removed (\d+) entries uid {uid} left", said)
        assert removed and int(removed[1]) >= 1, said  # its own, and any an earlier job left
    assert cluster.user(victim).check_output(f"srun --nodelist={BAD} hostname").strip() == BAD


def _quarantines_counted(cluster: LocalCluster) -> float:
    """slonk_node_events_total{event="quarantine"} as the controller's exporter serves it."""
    served = scrape(cluster, CONTROLLER)
    return sum(values(served, "slonk_node_events_total", event="quarantine", cause="quarantine"))


def _free_percent(cluster: LocalCluster, pod: str) -> float:
    out = cluster.pod(pod).check_output(f"stat --file-system --format='%a %b' {SCRATCH}")
    free, total = (int(n) for n in out.split())
    return 100.0 * free / total


def _shared_storage_undone(cluster: LocalCluster, values: Path, workers: tuple[str, ...]) -> None:
    """The cluster's settings back (upgrades add up) before the mounts go, and any drain the
    small file system left lifted, whatever the test reached: a node left drained would fail
    every later test's fixture."""
    storage = HEALTH_CHECKS["storage"]
    values.write_text(json.dumps({"health": {
        "watchSeconds": default_of(HealthSettings, "watch_seconds"),
        "checks": {"storage": {"phases": list(storage.phases), **storage.options}},
        "recycle": SESSION_RECYCLE,
    }}))  # fmt: skip
    cluster.slonk("upgrade", "-f", str(values))
    wait_for(
        "every worker's health plan without the small file system",
        lambda: all(
            SHARED not in cluster.pod(pod).check_output(f"cat {HEALTH_PLAN}") for pod in workers
        ),
    )
    controller = cluster.pod(CONTROLLER)
    for node, (_, reason) in cluster.nodes().items():
        if reason.startswith(f"slonk:storage: {SHARED} "):
            controller.run(f"scontrol update nodename={node} state=resume")


WINDOW = 3600  # the quarantine test's recycle window: what it counts stays in it throughout


def _recycle_fast(cluster: LocalCluster, max_recycles: int = 2) -> None:
    values = cluster.state_dir.parent / "recycle-fast.yaml"
    recycle = {"idleSeconds": 1, "maxRecycles": max_recycles, "windowSeconds": WINDOW}
    values.write_text(json.dumps({"health": {"recycle": recycle}}) + "\n")
    cluster.slonk("upgrade", "-f", str(values))


def _recycled_before(cluster: LocalCluster, node: str) -> int:
    """Recycles of `node` within WINDOW that the recycle loop has saved: a module that ran
    before on the session cluster may have recycled it (test_local_hooks does), and the loop
    counts those towards a quarantine too."""
    saved = json.loads(cluster.pod(CONTROLLER).check_output(f"cat {shlex.quote(str(HISTORY))}"))
    now = time.time()
    return sum(1 for t in saved.get("recycles", {}).get(node, []) if now - t < WINDOW)


def test_a_persons_drain_survives_every_check_and_recycle(faults: Faults):
    cluster = faults.cluster
    controller = cluster.pod(CONTROLLER)
    controller.check_output(f"scontrol update nodename={GOOD} state=drain reason=maintenance")
    _recycle_fast(cluster)
    pid = Cluster(cluster.state_dir).pid(GOOD)
    offset = _health_log_offset(cluster, GOOD)
    faults.gpu("ecc", pod=GOOD)
    left = "left idle+drain ('maintenance', set by 'root')"
    _wait_health_logged(
        cluster,
        GOOD,
        offset,
        f"{GOOD}'s health check to see the fault and leave the drain",
        f"interval: {ECC}",
        f"; {left}",
    )
    _recycle_pass(cluster)
    assert cluster.nodes()[GOOD] == ("idle+drain", "maintenance")
    faults.heal()
    assert f"node: {left}" in _health_run_by_hand(cluster, GOOD)
    _recycle_pass(cluster)
    assert cluster.nodes()[GOOD] == ("idle+drain", "maintenance")
    assert Cluster(cluster.state_dir).pid(GOOD) == pid  # never recycled


def test_a_node_failing_boot_checks_registers_drained_then_is_recycled_then_quarantined(
    faults: Faults,
):
    cluster = faults.cluster
    # Counted from the start: the recycle loop may still run the last test's fast settings
    # for a moment (config-watch applies `upgrade`), and recycle the node as soon as it
    # registers drained, before this test asks for them. (A first scrape starts the
    # controller's exporter counting, if none has yet.)
    recorded = len(cluster.node_history())
    quarantines = _quarantines_counted(cluster)
    deletes = _deletes_offset(cluster)
    before = _recycled_before(cluster, BAD)
    shown = sum(  # what `slonk nodes` counts: the node's history, over the same window
        1 for e in cluster.node_history()
        if e.node == BAD and e.event == "recycle" and time.time() - e.time < WINDOW
    )  # fmt: skip
    # The fault appears while the pod is away: a running pod's interval check would drain
    # the node for the same reason, and only the new pod's boot checks are under test.
    started = cluster.slurmd_started(BAD)
    cluster.slonk("stop", BAD)
    offset = cluster.log_offset(BAD)
    faults.gpu("missing", via=GOOD)
    cluster.slonk("restart", BAD)
    failed = "boot check failed: FAIL gpu        1 of 2 GPUs visible"
    wait_for(f"{BAD}'s boot checks to fail", lambda: failed in cluster.log(BAD, offset))
    reason = "slonk:gpu: 1 of 2 GPUs visible"

    def registered_drained() -> bool:
        node = cluster.node_states().get(BAD)
        return (
            node is not None
            and node.slurmd_started not in ("", "0", started)
            and (node.label, node.reason) == ("idle+drain", reason)
        )

    wait_for(f"a new slurmd on {BAD} registered drained", registered_drained)
    _recycle_fast(cluster, max_recycles=before + 2)  # two of this test's own, then quarantine
    quarantine = f"slonk:quarantine: recycled {before + 2} times in {WINDOW} s; last {reason}"
    # Two recycles: each a pod deleted, started, boot-checked and registered.
    wait_for(
        f"{BAD} quarantined",
        lambda: cluster.nodes()[BAD] == ("idle+drain", quarantine),
        timeout=180,
    )
    assert _deletes(cluster, BAD, deletes) == 2
    taint = {"key": "slonk.io/quarantine", "value": BAD, "effect": "NoSchedule"}

    def tainted() -> dict | None:
        """The Node, once the recycle loop tainted it (after the drain, in the same pass)."""
        node = json.loads(
            (cluster.state_dir / "apiserver" / "nodes" / f"local-{BAD}.json").read_text()
        )
        return node if taint in node["spec"].get("taints", []) else None

    node = wait_for(f"local-{BAD} tainted", tainted)
    wait_for(
        "the quarantine counted (metrics)",
        lambda: _quarantines_counted(cluster) == quarantines + 1,
    )
    assert node["metadata"]["annotations"]["slonk.io/quarantine-reason"] == quarantine
    # The machine's history holds all three, each from another pod of the same node, with
    # the GPU serial its boot run reported (one GPU visible: one serial).
    machine = f"local-{BAD}"
    kept = [
        e
        for e in cluster.node_history()[recorded:]
        if e.machine == machine and e.event in ("recycle", "quarantine")
    ]
    assert [(e.event, e.node, e.cause) for e in kept] == [
        ("recycle", BAD, "gpu"),
        ("recycle", BAD, "gpu"),
        ("quarantine", BAD, "quarantine"),
    ]
    assert kept[2].reason == quarantine
    assert len({e.podUID for e in kept}) == 3 and all(e.podUID for e in kept)
    assert all(len(e.gpus) == 1 and e.gpus[0].isdigit() for e in kept), kept
    # The operator's view, in the controller pod: the events across pods, newest last...
    printed = _in_controller(cluster, "slonk", "nodes", "history", machine).splitlines()
    events = [
        line.split()[2] for line in printed[1:] if line.split()[2] in ("recycle", "quarantine")
    ]
    assert events[-3:] == ["recycle", "recycle", "quarantine"]
    # ...the fleet at a glance...
    (line,) = [
        line.split() for line in _in_controller(cluster, "slonk", "nodes").splitlines()
        if line.startswith(f"{BAD} ")
    ]  # fmt: skip
    assert (line[1], line[2], line[-2], line[-1]) == (
        "idle+drain", "quarantine", str(shown + 2), machine
    )  # fmt: skip
    # ...and Kubernetes' Events on the Node (kubectl describe node).
    described = cluster.kubectl("describe", "node", machine)
    assert "SlonkQuarantined" in described and "SlonkRecycled" in described
    # Neither a healed GPU nor a new pod lifts a quarantine: that is the person's who
    # replaces the node (the fixture resumes it).
    faults.heal()
    started = cluster.slurmd_started(BAD)
    cluster.slonk("restart", BAD)
    # slurmd runs its first health run (the boot checks' say) before it registers.
    wait_for(
        f"a new slurmd on {BAD}", lambda: cluster.slurmd_started(BAD) not in ("", "0", started)
    )
    assert cluster.nodes()[BAD] == ("idle+drain", quarantine)
    assert f"node: left idle+drain ({quarantine!a}, set by " in _health_run_by_hand(cluster, BAD)
    _recycle_pass(cluster)
    assert cluster.nodes()[BAD] == ("idle+drain", quarantine)
    assert _deletes(cluster, BAD, deletes) == 2
