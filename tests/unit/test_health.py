"""Health checks: settings, each check against real probes (and the fake nvidia-smi), the
drain/resume rules, and the recycle loop's decisions."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path
from unittest.mock import ANY

import pytest

from slonk.align import recycle
from slonk.config.spec import HEALTH_CHECKS, RecycleSettings, SpecError, parse_spec
from slonk.health import checks, drains, gpu, probe, runner
from slonk.health.probe import Unhealthy, bounded
from slonk.kube.api import KubeError, PodReplaced
from slonk.slurm import reasons, slurm_nodes
from slonk.slurm.slurm_state import SlurmNotInstalled

from . import slurm_json

FAKE_GPU = Path(__file__).parents[1] / "fakes" / "fake-gpu"
NODE = checks.Node(name="slonk-cpu-0", gpus=2, peers=("localhost",))
LEFTOVER = (
    "GPU 0 (00000000:18:00.0): 40960 MiB still in use; "
    "process 48213 (python) left on a GPU with 40958 MiB"
)
GPU_OPTIONS = {
    **HEALTH_CHECKS["gpu"].options,
    "nvidiaSmi": f"{FAKE_GPU} nvidia-smi",
    "dmesg": f"{FAKE_GPU} dmesg",
}
BASE = {
    "clusterName": "c",
    "release": "slonk",
    "nodepools": {"cpu": {"replicas": 2, "cpus": 4, "memoryMiB": 1024}},
}


def _health(health):
    return parse_spec({**BASE, "health": health}).health


def test_health_is_off_unless_enabled():
    assert _health({}) is None
    settings = _health({"enabled": True})
    assert set(settings.checks) == set(HEALTH_CHECKS)
    assert settings.recycle.idle_seconds == 300


@pytest.mark.parametrize(
    ("health", "error"),
    [
        ({"enabled": True, "checks": {"gpuu": {}}}, "health.checks.gpuu: unknown key"),
        # slurmd start times are whole seconds: a node recycled at once could not be told from
        # its successor.
        (
            {"enabled": True, "recycle": {"idleSeconds": 0}},
            "health.recycle.idleSeconds: must be >= 1, got 0",
        ),
        (
            {"enabled": True, "checks": {"gpu": {"xids": ["79"]}}},
            "health.checks.gpu.xids[0]: expected an integer",
        ),
        (
            {"enabled": True, "checks": {"scratch": {"minFreePercent": -1}}},
            "health.checks.scratch.minFreePercent: must be >= 0",
        ),
        (
            {"enabled": True, "checks": {"dns": {"phases": ["always"]}}},
            "health.checks.dns.phases[0]: must be one of boot, prolog, epilog, watch, interval",
        ),
        (
            {"enabled": True, "recycle": {"maxRecycles": 0}},
            "health.recycle.maxRecycles: must be >= 1",
        ),
    ],
)
def test_bad_settings_name_the_key(health, error):
    with pytest.raises(SpecError, match=error.replace("[", r"\[").replace("]", r"\]")):
        _health(health)


def test_disabled_checks_are_left_out_and_cpu_pools_get_no_gpu_check():
    spec = parse_spec({**BASE, "health": {"enabled": True, "checks": {"dns": {"enabled": False}}}})
    plan = runner.plan_for(spec, "slonk-cpu-1")
    assert "dns" not in plan.checks and "gpu" not in plan.checks
    assert plan.node.peers == ("slonk-cpu-0", "slonk-cpu-1")
    assert runner.plan_for(spec, "slonk-login-0") is None


@pytest.fixture
def gpu_state(tmp_path, monkeypatch):
    state = tmp_path / "scenario"
    monkeypatch.setenv("FAKE_GPU_SCENARIO", str(state))
    return state


@pytest.mark.parametrize(
    ("scenario", "phase", "problem"),
    [
        ("healthy", "epilog", None),
        (
            "ecc",
            "prolog",
            "GPU 1 (00000000:2A:00.0): 2 uncorrectable ECC errors; "
            "GPU 1 (00000000:2A:00.0): row remap pending, needs a reset",
        ),
        ("remap", "interval", "GPU 0 (00000000:18:00.0): row remap failed"),
        ("missing", "boot", "1 of 2 GPUs visible"),
        (
            "lost",
            "boot",
            "Unable to determine the device handle for GPU0000:2A:00.0: Unknown Error",
        ),
        ("xid", "interval", "XID 79 on PCI:0000:2a:00 (x1)"),
        ("leftover", "prolog", None),  # memory in use is a problem only after a job
        ("leftover", "epilog", LEFTOVER),
        ("leftover", "watch", LEFTOVER),  # or between jobs
        ("leftover", "interval", LEFTOVER),
        ("leftover", "boot", None),
    ],
)
def test_gpu_check_reads_nvidia_smi_and_the_kernel_log(
    gpu_state, monkeypatch, scenario, phase, problem
):
    monkeypatch.setattr(checks, "jobs_here", lambda node: False)
    gpu_state.write_text(scenario)
    if problem is None:
        assert checks.check_gpu(NODE, GPU_OPTIONS, phase, 5) == "2 GPUs healthy"
    else:
        with pytest.raises(Unhealthy) as err:
            checks.check_gpu(NODE, GPU_OPTIONS, phase, 5)
        assert str(err.value) == problem


def test_between_jobs_only_a_node_with_no_job_must_have_its_gpus_free(gpu_state, monkeypatch):
    gpu_state.write_text("leftover")
    monkeypatch.setattr(checks, "jobs_here", lambda node: True)
    assert checks.check_gpu(NODE, GPU_OPTIONS, "watch", 5) == "2 GPUs healthy"
    # A job that begins while nvidia-smi looks holds its GPUs rightly: no drain for it.
    looks = iter([False, True])
    monkeypatch.setattr(checks, "jobs_here", lambda node: next(looks))
    assert checks.check_gpu(NODE, GPU_OPTIONS, "watch", 5) == "2 GPUs healthy"
    # Still no job after the look: what is on the GPUs was left there.
    monkeypatch.setattr(checks, "jobs_here", lambda node: False)
    with pytest.raises(Unhealthy, match="left on a GPU"):
        checks.check_gpu(NODE, GPU_OPTIONS, "watch", 5)


def test_a_job_is_seen_by_its_step_sockets_in_slurmds_spool(tmp_path):
    assert not checks.jobs_here(NODE, tmp_path / "absent")
    assert not checks.jobs_here(NODE, tmp_path)
    (tmp_path / "cred_state").touch()
    (tmp_path / f"{NODE.name}0_7.4294967292").touch()  # another node's name, longer
    assert not checks.jobs_here(NODE, tmp_path)
    (tmp_path / f"{NODE.name}_7.4294967292").touch()  # the extern step of job 7
    assert checks.jobs_here(NODE, tmp_path)
    unreadable = tmp_path / "file"
    unreadable.touch()
    assert checks.jobs_here(NODE, unreadable)  # not a directory: unsure, so yes


def test_an_unreadable_kernel_log_fails_loudly(gpu_state):
    with pytest.raises(Unhealthy, match="cannot read the kernel log for XIDs"):
        gpu.xids(
            "sh -c 'echo dmesg: read kernel buffer failed: Operation not permitted; exit 1'",
            {79},
            5,
        )


def test_a_hung_probe_is_abandoned_at_its_timeout():
    started = time.monotonic()
    with pytest.raises(Unhealthy, match=r"did not answer within 0\.2 s"):
        bounded(["sleep", "30"], 0.2)
    assert time.monotonic() - started < 5


def test_a_probe_that_outlives_its_kill_is_not_started_again_while_it_hangs(monkeypatch, tmp_path):
    """As a probe in uninterruptible sleep on a hung mount does: SIGKILL does not end it."""
    answers = tmp_path / "server-answers"
    argv = ["sh", "-c", 'test -e "$1" || sleep 30', "probe", str(answers)]
    monkeypatch.setattr(probe, "_ABANDONED", {})
    monkeypatch.setattr(probe.os, "killpg", lambda pid, sig: None)
    with pytest.raises(Unhealthy, match=r"did not answer within 0\.2 s"):
        bounded(argv, 0.2)
    (hanging,) = probe._ABANDONED.values()
    # A timeout, and nothing started: a second copy would hang beside the first.
    with pytest.raises(probe.TimedOut, match="sh -c still hangs since an earlier timeout"):
        bounded(argv, 0.2)
    assert probe._ABANDONED[tuple(argv)] is hanging  # still kept
    answers.touch()  # the server answers at last
    hanging.kill()
    hanging.wait()
    assert bounded(argv, 5) == (0, "")
    assert probe._ABANDONED == {}


def test_a_probe_slow_to_end_after_its_kill_is_waited_for_before_a_second_look(monkeypatch):
    """Killed, a probe slowed by the host (a page to read back, a kernel lock) ends soon:
    the next look (boot's second try at once) waits for it, up to its own timeout."""
    monkeypatch.setattr(probe, "_ABANDONED", {})
    monkeypatch.setattr(probe.os, "killpg", lambda pid, sig: None)
    argv = ["sleep", "1"]
    with pytest.raises(probe.TimedOut):
        bounded(argv, 0.2)
    assert bounded(argv, 10) == (0, "")
    assert probe._ABANDONED == {}


def test_a_probe_that_answered_while_its_reader_waited_for_a_cpu_passes(monkeypatch):
    """The probe ended in time, but the thread reading it got a CPU only after its timeout:
    the answer counts (the thread was late, not the probe)."""
    communicate = subprocess.Popen.communicate
    late: list[subprocess.Popen[str]] = []

    def back_after_the_timeout(self, input=None, timeout=None):
        if not late:
            late.append(self)
            os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped
            raise subprocess.TimeoutExpired(self.args, timeout)
        return communicate(self, input, timeout)

    monkeypatch.setattr(probe, "_ABANDONED", {})
    monkeypatch.setattr(subprocess.Popen, "communicate", back_after_the_timeout)
    assert bounded(["echo", "answered"], 0.2) == (0, "answered\n")
    assert late and probe._ABANDONED == {}


def test_a_hung_check_times_out_and_the_others_still_report(monkeypatch, tmp_path):
    monkeypatch.setitem(checks.CHECKS, "dns", lambda *a: time.sleep(30))
    plan = runner.CheckPlan(
        NODE,
        True,
        {
            "dns": {"phases": ["interval"], "timeoutSeconds": 0.1, "options": {}},
            "interfaces": {
                "phases": ["interval"],
                "timeoutSeconds": 5,
                "options": {"names": ["lo"], "rdmaDevices": []},
            },
            "munge": {"phases": ["boot"], "timeoutSeconds": 5, "options": {}},
        },
        10,
    )
    dns, interfaces = runner.run(plan, "interval", state=tmp_path / "no-pod")  # counts at once
    assert (dns.ok, dns.detail, dns.timed_out) == (False, "timed out after 0.1 s", True)
    assert interfaces.check == "interfaces"  # lo has no global address
    assert (interfaces.ok, interfaces.detail) == (False, "lo has no address")


def _dns_answers(monkeypatch, *answers: str) -> runner.CheckPlan:
    """A dns check that hangs or passes, in the order given, and a plan that runs it."""
    given = iter(answers)

    def dns(*args):
        if next(given) == "hang":
            raise probe.TimedOut("getent hosts did not answer within 5 s")
        return "resolved"

    monkeypatch.setitem(checks.CHECKS, "dns", dns)
    phases = {"phases": ["boot", "interval"], "timeoutSeconds": 5, "options": {}}
    return runner.CheckPlan(NODE, True, {"dns": phases}, 10)


def test_a_check_out_of_time_fails_the_second_time_in_a_row(monkeypatch, tmp_path, capsys):
    """Once can be a loaded host (a disk read, a kernel lock): no result, as a check that
    cannot tell, and the pod's log says so. Out of time on its next run too, it fails; a pass
    in between starts over. Results that do not read count as none."""
    plan = _dns_answers(monkeypatch, "hang", "hang", "pass", "hang", "hang")
    assert runner.run(plan, "interval", state=tmp_path) == []
    assert "slonk health: interval: dns out of time, once: getent hosts" in capsys.readouterr().err
    (second,) = runner.run(plan, "interval", state=tmp_path)
    assert (second.ok, second.detail) == (False, "getent hosts did not answer within 5 s")
    (passed,) = runner.run(plan, "interval", state=tmp_path)
    assert passed.ok
    assert runner.run(plan, "interval", state=tmp_path) == []
    runner.results_path("interval", tmp_path).write_text("[1]\n")
    assert runner.run(plan, "interval", state=tmp_path) == []


def test_a_run_begun_just_after_a_timed_out_one_ended_is_its_second_look(tmp_path):
    """A check's end is kept as it was, not rounded: rounded up, a run that began 0.2 ms
    after it ended seemed to have run beside it (a unit test's runs are that close)."""
    timed_out = runner.Result("dns", False, "no answer", seconds=0.0006, timed_out=True)
    assert runner.save_results([timed_out], "interval", 1000.0, tmp_path)
    assert runner._timed_out_before("interval", tmp_path, 1000.0008) == {"dns"}
    # Begun before it ended: one going beside it, which saw the same stall.
    assert runner._timed_out_before("interval", tmp_path, 1000.0005) == set()


def test_a_run_beside_it_or_results_not_kept_are_no_first_time(monkeypatch, tmp_path):
    """A run of the phase still going when this one began (slurmd does not wait for the last
    before it starts the next) saw the same stall: no second look. Results that cannot be
    saved keep no first time: the timeout counts at once."""
    plan = _dns_answers(monkeypatch, "hang", "hang")
    overlapping = {"check": "dns", "ok": False, "detail": "x", "seconds": 5, "timed_out": True}
    results = runner.results_path("interval", tmp_path)
    results.write_text(json.dumps([{**overlapping, "time": time.time() + 60}]))
    assert runner.run(plan, "interval", state=tmp_path) == []
    results.unlink()
    results.mkdir()  # no file can be written there
    (failed,) = runner.run(plan, "interval", state=tmp_path)
    assert (failed.ok, failed.timed_out) == (False, True)


def test_at_boot_a_check_out_of_time_runs_again_at_once(monkeypatch, tmp_path):
    """Boot runs once per pod, and its failures stand for the pod's life: its second try is
    now, before slurmd starts."""
    plan = _dns_answers(monkeypatch, "hang", "pass", "hang", "hang")
    (booted,) = runner.run(plan, "boot", state=tmp_path)
    assert booted.ok
    (failed,) = runner.run(plan, "boot", state=tmp_path)
    assert (failed.ok, failed.timed_out) == (False, True)


def _starving() -> list[str]:
    """A probe of two busy processes on one CPU: each waits for it half the time."""
    if probe.queued_seconds(Path("/proc/self")) is None:
        pytest.skip("this kernel keeps no run-queue time (schedstat)")
    cpu = str(min(os.sched_getaffinity(0)))
    return ["taskset", "-c", cpu, "sh", "-c", "yes >/dev/null & yes >/dev/null"]


def test_a_probe_starved_of_cpu_cannot_tell_and_a_sleeping_one_fails(monkeypatch):
    """Out of time, a probe ready to run but given no CPU was starved (and is not kept as
    hanging: it ends once it gets a CPU). One that sleeps (a hung mount) fails, however busy
    the node: it waits on no run queue."""
    monkeypatch.setattr(probe, "_ABANDONED", {})
    with pytest.raises(
        probe.Inconclusive, match=r"^taskset -c did not answer within 1 s, starved of CPU \d+%"
    ):
        bounded(_starving(), 1)
    assert probe._ABANDONED == {}
    with pytest.raises(probe.TimedOut, match=r"^sleep 30 did not answer within 3 s$") as failed:
        bounded(["sleep", "30"], 3)
    assert not isinstance(failed.value, probe.Inconclusive)


@pytest.mark.parametrize(
    ("elapsed", "queued", "inconclusive"),
    [(10, 8, True), (10, 7.5, True), (10, 7, False), (10, None, False), (0, 0, False)],
)
def test_out_of_time_is_inconclusive_when_starved_most_of_the_time(elapsed, queued, inconclusive):
    error = probe.out_of_time("x did not answer", elapsed, queued)
    assert isinstance(error, probe.Inconclusive) == inconclusive
    assert str(error).startswith("x did not answer")


def test_a_check_that_cannot_tell_has_no_result_and_says_so(monkeypatch, capsys):
    """Neither a failure (no drain, no boot failure for the pod's life) nor a pass (a drain
    for it is not lifted: drains.decide)."""

    def starved_probe(*args):
        raise probe.Inconclusive("nvidia-smi did not answer within 5 s, starved of CPU 97%")

    monkeypatch.setitem(checks.CHECKS, "gpu", starved_probe)
    plan = runner.CheckPlan(
        NODE,
        True,
        {
            "gpu": {"phases": ["boot"], "timeoutSeconds": 5, "options": {}},
            "interfaces": {
                "phases": ["boot"],
                "timeoutSeconds": 5,
                "options": {"names": ["lo"], "rdmaDevices": []},
            },
        },
        10,
    )
    (interfaces,) = runner.run(plan, "boot")
    assert (interfaces.check, interfaces.ok) == ("interfaces", False)
    assert (
        "slonk health: boot: gpu inconclusive: nvidia-smi did not answer within 5 s, "
        "starved of CPU 97%"
    ) in capsys.readouterr().err
    assert drains.decide(_node("slonk:gpu: XID 79"), [], undrain=True) is None


def test_a_check_ready_to_report_past_its_time_is_waited_for(monkeypatch):
    """A check thread that is ready to run has its answer and lacks only a CPU; one asleep
    past its time (test_a_hung_check_times_out_and_the_others_still_report) fails."""

    def late(*args):
        until = time.monotonic() + 3  # busy: ready to run throughout
        while time.monotonic() < until:
            pass
        return "answered late"

    monkeypatch.setattr(runner, "JOIN_SLACK_SECONDS", 0.0)
    monkeypatch.setitem(checks.CHECKS, "dns", late)
    plan = runner.CheckPlan(
        NODE, True, {"dns": {"phases": ["interval"], "timeoutSeconds": 2, "options": {}}}, 10
    )
    (dns,) = runner.run(plan, "interval")
    assert (dns.ok, dns.detail) == (True, "answered late")


def test_a_check_out_of_time_asleep_on_a_starved_probe_cannot_tell(monkeypatch, capsys):
    """A check runs probes in turn, each within the check's timeout: past it, the probe the
    check waits on is judged, not the sleeping check."""
    monkeypatch.setattr(probe, "_ABANDONED", {})
    monkeypatch.setattr(runner, "JOIN_SLACK_SECONDS", 0.0)
    starving = _starving()
    monkeypatch.setitem(checks.CHECKS, "dns", lambda *args: bounded(starving, 2))
    plan = runner.CheckPlan(
        NODE, True, {"dns": {"phases": ["interval"], "timeoutSeconds": 1, "options": {}}}, 10
    )
    try:
        assert runner.run(plan, "interval") == []
        assert "dns inconclusive: timed out after 1 s, starved of CPU" in capsys.readouterr().err
    finally:
        # The abandoned check's probe is killed at its own timeout: wait for it, or a run
        # whose last test this is exits first and leaves two `yes` spinning (seen).
        deadline = time.monotonic() + 30
        while probe.PROBING and time.monotonic() < deadline:
            time.sleep(0.05)
    assert not probe.PROBING, "the starving probe outlived its timeout"


def test_storage_and_scratch_checks(tmp_path, monkeypatch):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"1 0 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
        f"2 1 0:5 / {tmp_path} rw,nosuid - tmpfs tmpfs rw\n"
        f"3 1 0:6 / /shared ro,nosuid - nfs4 server:/export rw\n"
    )
    monkeypatch.setattr(checks, "MOUNTINFO", mountinfo)
    assert checks.check_storage(NODE, {"paths": [str(tmp_path)]}, "boot", 5).endswith("writable")
    assert list(tmp_path.iterdir()) == [mountinfo]  # the probe left nothing
    with pytest.raises(Unhealthy, match="/shared is mounted read-only"):
        checks.check_storage(NODE, {"paths": ["/shared"]}, "boot", 5)
    with pytest.raises(Unhealthy, match="/nowhere is not mounted"):
        checks.check_storage(NODE, {"paths": ["/nowhere"]}, "boot", 5)
    scratch = {"path": str(tmp_path), "minFreePercent": 0}
    assert "free" in checks.check_scratch(NODE, scratch, "boot", 5)
    with pytest.raises(Unhealthy, match=r"below 101%"):
        checks.check_scratch(NODE, {**scratch, "minFreePercent": 101}, "boot", 5)


def test_a_mount_turned_read_only_during_the_write_is_named_read_only(
    tmp_path, monkeypatch, capsys
):
    """Remounted read-only between the look at the mount and the probe's `rm` (an integration
    run saw it): the reason names the mount, as the next look would, not the failed `rm`."""
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"2 1 0:5 / {tmp_path} rw - tmpfs tmpfs rw\n")
    monkeypatch.setattr(checks, "MOUNTINFO", mountinfo)

    def remounted_meanwhile(argv: list[str], timeout: float) -> tuple[int, str]:
        mountinfo.write_text(f"2 1 0:5 / {tmp_path} ro - tmpfs tmpfs rw\n")
        return 1, "rm: cannot remove '.slonk-health.x': Read-only file system"

    monkeypatch.setattr(checks, "bounded", remounted_meanwhile)
    with pytest.raises(Unhealthy, match=f"^{re.escape(str(tmp_path))} is mounted read-only$"):
        checks.check_storage(NODE, {"paths": [str(tmp_path)]}, "watch", 5)
    assert "failed: rm: cannot remove '.slonk-health.x': Read-only" in capsys.readouterr().err
    # Still writable by the mount's word: the probe's own failure is the reason.
    mountinfo.write_text(f"2 1 0:5 / {tmp_path} rw - tmpfs tmpfs rw\n")
    monkeypatch.setattr(checks, "bounded", lambda argv, timeout: (1, "mktemp: No space left"))
    with pytest.raises(Unhealthy, match=r"is not writable: mktemp: No space left$"):
        checks.check_storage(NODE, {"paths": [str(tmp_path)]}, "watch", 5)


def test_a_user_cannot_plant_the_storage_probe(tmp_path, monkeypatch):
    """A directory or a link where an older probe wrote (`.slonk-health-<node>`) made every
    node writing there fail its check, or wrote through the link."""
    monkeypatch.setattr(checks, "MOUNTINFO", tmp_path / "mountinfo")
    (tmp_path / "mountinfo").write_text(f"2 1 0:5 / {tmp_path} rw - tmpfs tmpfs rw\n")
    (tmp_path / f".slonk-health-{NODE.name}").mkdir()
    (tmp_path / ".slonk-health.link").symlink_to("/etc/passwd")
    assert checks.check_storage(NODE, {"paths": [str(tmp_path)]}, "watch", 5).endswith("writable")
    # What was there stays, as it was; the probe left nothing of its own.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".slonk-health-slonk-cpu-0",
        ".slonk-health.link",
        "mountinfo",
    ]


def test_health_reads_every_node_in_one_call(monkeypatch):
    calls = []

    def scontrol(*args):
        calls.append(args)
        return slurm_json.text("scontrol-show-node.json")

    monkeypatch.setattr(slurm_nodes, "scontrol", scontrol)
    assert [n.name for n in slurm_nodes.read_nodes()] == ["bare", "n1", "n2", "n3", "n4"]
    slurm_nodes.read_nodes("n1")
    assert calls == [("show", "node", "--json"), ("show", "node", "n1", "--json")]


def test_a_slurm_command_that_is_missing_or_fails_is_a_slurm_error(tmp_path):
    """Not a traceback: a pod's loops report it (a pod of another image). A program that is
    not there, or cannot be run, is said to be so: asking again cannot help."""
    with pytest.raises(SlurmNotInstalled, match="No such file or directory"):
        slurm_nodes.run([str(tmp_path / "scontrol"), "show", "node"])
    (tmp_path / "scontrol").write_text("#!/bin/sh\n")  # not executable
    with pytest.raises(SlurmNotInstalled, match="Permission denied"):
        slurm_nodes.run([str(tmp_path / "scontrol"), "show", "node"])
    with pytest.raises(slurm_nodes.SlurmError, match="false: failed") as failed:
        slurm_nodes.run(["false"], failed="false")
    assert not isinstance(failed.value, SlurmNotInstalled)


def _node(reason="", drained=True, state="idle", started="t0"):
    flags = frozenset({"DRAIN"} if drained else ())
    return slurm_nodes.NodeState("n", state, flags, reason, started)


def _result(check, ok, detail="bad"):
    return runner.Result(check, ok, detail, 0.0)


@pytest.mark.parametrize(
    ("current", "results", "expected"),
    [
        (_node(drained=False), [_result("gpu", False, "XID 79")], ("drain", "slonk:gpu: XID 79")),
        (_node(drained=False), [_result("gpu", True)], None),
        # a person's drain is theirs, whatever the checks say
        (_node("maintenance"), [_result("gpu", False)], None),
        (_node("maintenance"), [_result("gpu", True)], None),
        # slonk's own drain: kept while its check fails, lifted once it passes
        (_node("slonk:gpu: XID 79"), [_result("gpu", False)], None),
        (_node("slonk:gpu: XID 79"), [_result("gpu", True)], ("resume", "slonk:gpu: XID 79")),
        (
            _node("slonk:gpu: XID 79"),
            [_result("gpu", True), _result("scratch", False, "full")],
            ("drain", "slonk:scratch: full"),
        ),
        # a check that did not run this time neither keeps nor lifts another's drain
        (_node("slonk:gpu: XID 79"), [_result("scratch", True)], None),
        # hooks' and the recycler's drains are not health's to lift, nor to replace
        (_node("slonk:hook:prolog:10-x: exit 1"), [_result("gpu", True)], None),
        (_node("slonk:hook:prolog:10-x: exit 1"), [_result("gpu", False)], None),
        (_node("slonk:prolog:10-x: exit 1"), [_result("gpu", True)], None),  # before `hook:`
        (_node("slonk:quarantine: recycled 3 times"), [_result("gpu", True)], None),
        (_node("slonk:quarantine: recycled 3 times"), [_result("gpu", False)], None),
        # the syncer's drain gives way to the machine's fault, and is the syncer's to lift;
        # once the check passes, the node goes back to the syncer, not into service
        (
            _node("slonk:k8s:cordoned: x"),
            [_result("gpu", False, "XID 79")],
            ("drain", "slonk:gpu: [k8s] XID 79"),
        ),
        (_node("slonk:k8s:cordoned: x"), [_result("gpu", True)], None),
        (
            _node("slonk:gpu: [k8s] XID 79"),
            [_result("gpu", True)],
            ("drain", "slonk:k8s:recheck: gpu passes again"),
        ),
        # what only looks like slonk's is a person's
        (_node("slonk:gpu:typed by hand"), [_result("gpu", True)], None),
        (_node("slonk: broken"), [_result("gpu", False)], None),
    ],
)
def test_drain_and_resume_rules(current, results, expected):
    assert drains.decide(current, results, undrain=True) == expected


@pytest.mark.parametrize(
    ("current", "results", "expected"),
    [
        # A site's check removed (or any check turned off): its drain goes with the next round.
        (_node("slonk:active:diag: diag exited with 3: Fail"), [], ("resume", ANY)),
        (_node("slonk:active:diag: x"), [_result("gpu", False)], ("drain", "slonk:gpu: bad")),
        # Still planned and without a result (its program absent this boot): left as it is.
        (_node("slonk:active:gpu-memory: GPU 1 slow"), [], None),
        # A trend's drain waits for a person, planned or not; a person's is theirs.
        (_node("slonk:trend:gone: GPU 1 rose"), [], None),
        (_node("maintenance"), [], None),
    ],
)
def test_a_drain_for_a_check_no_longer_planned_is_lifted(current, results, expected):
    planned = {"gpu", "active:gpu-memory"}
    assert drains.decide(current, results, undrain=True, planned=planned) == expected


def test_undrain_can_be_turned_off():
    assert drains.decide(_node("slonk:gpu: XID 79"), [_result("gpu", True)], undrain=False) is None


SETTINGS = RecycleSettings(
    idle_seconds=60, period_seconds=1, max_recycles=2, window_seconds=600, taint_nodes=True
)


def test_recycling_waits_for_idle_then_for_the_new_pod_then_quarantines():
    history = recycle.History()

    def due(current, now):
        actions = recycle.due([current], history, SETTINGS, now)
        return [(action, recent) for action, _, recent in actions]

    def recycled(current, now):
        history.recycles[current.name].append(now)
        history.restarting[current.name] = current.slurmd_started
        history.idle_since.pop(current.name)

    old_pod = _node("slonk:gpu: XID 79", started="t0")
    assert due(old_pod, 1000) == []
    assert due(old_pod, 1059) == []
    assert due(old_pod, 1060) == [("recycle", 0)]
    recycled(old_pod, 1060)
    assert due(old_pod, 1100) == []  # the old pod's drain shows until a new slurmd registers
    new_pod = _node("slonk:gpu: XID 79", started="t1")
    assert due(new_pod, 1100) == []
    assert due(new_pod, 1160) == [("recycle", 1)]
    recycled(new_pod, 1160)
    newer_pod = _node("slonk:gpu: XID 79", started="t2")
    assert due(newer_pod, 1200) == []
    assert due(newer_pod, 1260) == [("quarantine", 2)]
    # recycles older than the window are forgotten
    assert due(newer_pod, 1060 + 600) == [("recycle", 1)]


@pytest.mark.parametrize(
    "current",
    [
        _node("maintenance"),
        _node("slonk:gpu: XID 79", state="mixed"),  # still draining its jobs
        _node("slonk:quarantine: recycled 2 times"),
        _node(drained=False),
        # a failing script is fixed in git: recycling machines for it would quarantine them all
        _node("slonk:hook:prolog:10-x: exit 1"),
        _node("slonk:hook:epilog:10-x: timed out after 30 s"),
        _node("slonk:prolog:10-x: exit 1"),
        _node("slonk:pod: stopping"),
    ],
)
def test_recycling_leaves_busy_healthy_quarantined_hooks_and_peoples_nodes_alone(current):
    history = recycle.History()
    assert list(recycle.due([current], history, SETTINGS, now=0)) == []
    assert list(recycle.due([current], history, SETTINGS, now=10_000)) == []


def test_boot_failures_stand_until_the_pod_restarts(tmp_path):
    saved = tmp_path / "boot.json"
    at_boot = [_result("gpu", False, "1 of 2 GPUs visible"), _result("scratch", True)]
    runner.save_boot_results(at_boot, saved)
    now = [_result("gpu", True, "2 GPUs healthy"), _result("dns", True)]
    merged = drains.with_boot_failures(now, runner.boot_results(saved))
    assert [(r.check, r.ok) for r in merged] == [("gpu", False), ("dns", True)]


class FlakyKubernetes:
    """Records taints; the first fails as an API server might."""

    def __init__(self) -> None:
        self.tainted: list[str] = []

    def delete_pod(self, name: str, uid: str = "") -> None:
        raise AssertionError("no pod is due")

    def quarantine_node(self, pod: str, slurm_node: str, reason: str) -> str:
        if not self.tainted:
            self.tainted.append("refused")
            raise KubeError("taint node local: 503 Service Unavailable")
        self.tainted.append(slurm_node)
        return "local"


def test_a_taint_that_failed_is_tried_again():
    kube, history = FlakyKubernetes(), recycle.History(untainted={"n": "slonk:quarantine: x"})
    with pytest.raises(KubeError):
        recycle.taint(kube, history)
    assert history.untainted == {"n": "slonk:quarantine: x"}
    recycle.taint(kube, history)
    assert kube.tainted == ["refused", "n"] and history.untainted == {}


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ("slonk:gpu: 1 of 2 GPUs visible", ("health", "gpu")),
        ("slonk:hook:prolog:10-x: exit 1", ("hook", "prolog:10-x")),
        ("slonk:hook:epilog:a: b: c: exit 2", ("hook", "epilog:a")),
        ("slonk:prolog:10-x: exit 1", ("hook", "prolog:10-x")),
        ("slonk:quarantine: recycled 2 times", ("quarantine", "quarantine")),
        ("slonk:pod: stopping", ("pod", "pod")),
        ("slonk:scale-down: pod leaving", ("scale-down", "scale-down")),  # never recycled
        ("maintenance", None),
        ("", None),
        ("slonk:", None),
        ("slonk: gpu: x", None),
        ("slonk:GPU: x", None),
        ("slonk:gpu:x", None),
        ("Slonk:gpu: x", None),
    ],
)
def test_one_classifier_reads_every_reason(reason, cause):
    found = reasons.classify(reason)
    assert (found and (found.kind, found.name)) == cause if cause else found is None


def test_every_writer_is_read_back_as_its_kind():
    for check in checks.CHECKS:
        assert reasons.classify(runner.Result(check, False, "x", 0).reason) == reasons.Cause(
            reasons.HEALTH, check
        )
        assert check not in reasons.RESERVED
    assert reasons.classify(reasons.hook("prolog", "10-x", "exit 1")).kind == reasons.HOOK
    assert reasons.classify(reasons.quarantine("recycled")).kind == reasons.QUARANTINE
    assert reasons.classify(reasons.scale_down("pod leaving")).kind == reasons.SCALE_DOWN
    for word in reasons.RESERVED:
        with pytest.raises(ValueError):
            reasons.health(word, "x")


def test_a_reason_is_one_bounded_line():
    reason = reasons.hook("prolog", "x", "first\nsecond\r\x1b[2J" + "y" * 500)
    assert reason.startswith("slonk:hook:prolog:x: first second ?[2J")
    assert len(reason) == reasons.MAX_LENGTH


# What Python's str.splitlines() ends a line at, beyond \n and \r.
LINE_ENDS = ("\u2028", "\u2029", "\x85", "\x1c", "\x1d", "\x1e", "\x0b", "\x0c")


@pytest.mark.parametrize("odd", [*LINE_ENDS, "\x00", "\x1b", "\x7f", "\u00e9", "\ud800"])
def test_every_reason_is_printable_ascii_whatever_it_is_given(odd):
    """A script's name comes from git: `30-x<U+2028>y` exiting 1 must not write a reason
    that a reader of `scontrol --oneliner` splits in two."""
    written = [
        reasons.hook("prolog", f"x{odd}y", f"exit{odd}1"),
        reasons.health("gpu", f"GPU{odd}0 lost"),
        reasons.quarantine(f"recycled 2 times; last slonk:gpu: {odd}"),
    ]
    for reason in written:
        assert all(" " <= char <= "~" for char in reason), reason
        assert reason.splitlines() == [reason]
    blank = " " if odd.isspace() else "?"  # line ends read as blanks, the rest as unknown
    assert written[0] == f"slonk:hook:prolog:x{blank}y: exit{blank}1"
    assert [reasons.classify(r).kind for r in written] == ["hook", "health", "quarantine"]


def _record(name, state, reason=""):
    return slurm_json.node(name, state.split("+"), reason)


def test_a_node_with_no_record_is_a_slurm_error(monkeypatch):
    monkeypatch.setattr(slurm_nodes, "scontrol", lambda *args: slurm_json.text(
        "scontrol-show-node-unknown-name.json"))  # fmt: skip
    with pytest.raises(slurm_nodes.SlurmError, match="no record of the node could be read"):
        drains.apply("n", [_result("gpu", False)], undrain=True)


def test_output_that_cannot_be_read_drains_and_resumes_nothing(monkeypatch):
    updates = []

    def scontrol(*args):
        if args[0] == "update":
            updates.append(args)
        return '{"nodes": [{"name": "n", "state": ["IDLE", "DRAIN"]}]}'  # no reason

    monkeypatch.setattr(slurm_nodes, "scontrol", scontrol)
    with pytest.raises(slurm_nodes.SlurmError, match="`reason` is missing"):
        drains.apply("n", [_result("gpu", True)], undrain=True)
    assert updates == []


def test_a_hostile_reason_on_another_node_leaves_this_one_alone(monkeypatch):
    """n1's reason spells n4's record as `scontrol --oneliner` printed them: n4 stays idle
    and undrained, and a passing check resumes nothing."""
    updates = []

    def scontrol(*args):
        if args[0] == "update":
            updates.append(args)
        return slurm_json.text("scontrol-show-node.json")

    monkeypatch.setattr(slurm_nodes, "scontrol", scontrol)
    assert drains.apply("n4", [_result("gpu", True)], undrain=True) == "left idle"
    said = drains.apply("n1", [_result("gpu", True)], undrain=True)
    assert said.startswith("left mixed+drain (\"person's words NodeName=n4")
    assert said.isascii() and said.isprintable()  # one line of the log, escaped
    assert updates == []


@pytest.fixture(autouse=True)
def _node_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recycle loop records in a test's own history, never the host's."""
    monkeypatch.setattr(recycle, "NODE_HISTORY", tmp_path / "node-history.jsonl")


# Two of five nodes may be drained by one check (a third would be a shared dependency's).
RECYCLE_NOW = {
    "enabled": True,
    "maxDrainedPercent": 40,
    "recycle": {"idleSeconds": 1, "maxRecycles": 5},
}


class RecordingKubernetes:
    def __init__(self, refuse=(), replaced=()) -> None:
        self.deleted: list[str] = []
        self.refuse, self.replaced = refuse, replaced
        self.events: list[tuple[str, dict]] = []

    def pod_place(self, name: str) -> tuple[str, str]:
        return f"local-{name}", f"uid-{name}"

    def create_event(self, namespace: str, body: dict) -> None:
        self.events.append((namespace, body))

    def delete_pod(self, name: str, uid: str = "") -> None:
        if name in self.refuse:
            raise KubeError(f"delete pod {name}: 422 Unprocessable Entity")
        if name in self.replaced:
            raise PodReplaced(f"delete pod {name}: 409 Conflict")
        assert uid == f"uid-{name}", "only the pod inspected"
        self.deleted.append(name)

    def quarantine_node(self, pod: str, slurm_node: str, reason: str) -> str:
        return "local"


def _recycle_pass(monkeypatch, text, kube, history):
    """One pass at t=1000 over nodes seen idle since a second before (idleSeconds is 1)."""
    monkeypatch.setattr(slurm_nodes, "scontrol", lambda *args: slurm_json.nodes(*text)
                        if isinstance(text, list) else text)  # fmt: skip
    for record in text if isinstance(text, list) else []:
        history.idle_since.setdefault(record["name"], 999)
    recycle.pass_once(parse_spec({**BASE, "health": RECYCLE_NOW}), kube, history, now=1000)


def test_the_recycler_goes_on_past_a_refused_node(monkeypatch, capsys):
    text = [
        _record("slonk-cpu-0", "IDLE+DRAIN", "slonk:gpu: XID 79"),
        _record("slonk-cpu-1", "IDLE+DRAIN", "slonk:gpu: 1 of 2 GPUs visible"),
        _record("slonk-cpu-2", "IDLE+DRAIN", "slonk:hook:prolog:x?y: exit 1"),
        _record("slonk-cpu-3", "IDLE+DRAIN", "x\nslonk:gpu: forged"),  # a person's
        _record("slonk-cpu-4", "IDLE+DRAIN", reasons.scale_down("pod leaving")),  # upgrade's
    ]
    kube, history = RecordingKubernetes(refuse=("slonk-cpu-0",)), recycle.History()
    _recycle_pass(monkeypatch, text, kube, history)
    assert kube.deleted == ["slonk-cpu-1"]  # a hook's drain is never recycled
    assert "could not recycle slonk-cpu-0, trying again next pass" in capsys.readouterr().err
    kube.refuse = ()
    _recycle_pass(monkeypatch, text, kube, history)
    assert kube.deleted == ["slonk-cpu-1", "slonk-cpu-0"]


def test_a_pod_replaced_since_it_was_inspected_is_left_to_its_new_slurmd(monkeypatch, capsys):
    """Replaced by someone else between the look and the delete (409 on the uid): no recycle
    counted, no event, and the node waits for the new pod's slurmd as after a recycle."""
    drained = [_record("slonk-cpu-0", "IDLE+DRAIN", "slonk:gpu: XID 79")]
    kube, history = RecordingKubernetes(replaced=("slonk-cpu-0",)), recycle.History()
    _recycle_pass(monkeypatch, drained, kube, history)
    assert "its pod was replaced since it was looked at" in capsys.readouterr().err
    assert (kube.deleted, kube.events, history.recycles["slonk-cpu-0"]) == ([], [], [])
    kube.replaced = ()
    _recycle_pass(monkeypatch, drained, kube, history)  # the old slurmd's drain still showing
    assert kube.deleted == []


def test_a_record_the_recycler_cannot_read_fails_the_pass_and_recycles_nothing(monkeypatch):
    broken = _record("slonk-cpu-1", "IDLE+DRAIN", "slonk:gpu: XID 79")
    del broken["slurmd_start_time"]
    text = [_record("slonk-cpu-0", "IDLE+DRAIN", "slonk:gpu: XID 79"), broken]
    kube, history = RecordingKubernetes(), recycle.History()
    missing = "'slonk-cpu-1': `slurmd_start_time` is missing"
    with pytest.raises(slurm_nodes.SlurmError, match=missing):
        _recycle_pass(monkeypatch, text, kube, history)
    assert kube.deleted == []


def test_a_recycled_node_waits_for_a_new_slurmd(monkeypatch):
    """Until the node's slurmd_start_time changes, its drain is the old pod's."""
    drained = [_record("slonk-cpu-0", "IDLE+DRAIN", "slonk:gpu: XID 79")]
    kube, history = RecordingKubernetes(), recycle.History()
    _recycle_pass(monkeypatch, drained, kube, history)
    _recycle_pass(monkeypatch, drained, kube, history)
    assert kube.deleted == ["slonk-cpu-0"]
    drained[0]["slurmd_start_time"]["number"] += 30  # a new pod's slurmd, failing again
    _recycle_pass(monkeypatch, drained, kube, history)
    assert kube.deleted == ["slonk-cpu-0", "slonk-cpu-0"]


def test_a_pass_that_fails_for_any_reason_does_not_stop_the_loop(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(recycle, "PASS_LOCK", tmp_path / "recycle.lock")
    passes = []

    def pass_once(spec, kube, history, now):
        passes.append(now)
        if len(passes) == 1:
            raise KeyError("State")  # what a record it could not read once raised

    class Stop(threading.Event):  # set once two passes ran
        def wait(self, timeout=None):
            return len(passes) == 2

    monkeypatch.setattr(recycle, "pass_once", pass_once)
    monkeypatch.setattr(recycle.History, "load", classmethod(lambda cls: cls()))
    monkeypatch.setattr(recycle.History, "save", lambda self, path=None: None)
    spec = parse_spec({**BASE, "health": RECYCLE_NOW})
    recycle.run_forever(lambda: spec, lambda namespace: RecordingKubernetes(), Stop())
    assert len(passes) == 2
    assert "pass failed, trying again next period: KeyError: 'State'" in capsys.readouterr().err


def test_a_pass_waits_while_the_other_controllers_pass_holds_the_lock(monkeypatch, tmp_path):
    """With a backup, both controller pods may think for a moment that they hold control: the
    pass of one runs, the other's is skipped, each on the record as the volume has it."""
    monkeypatch.setattr(recycle, "PASS_LOCK", tmp_path / "recycle.lock")
    passes = []
    monkeypatch.setattr(recycle, "pass_once", lambda spec, kube, history, now: passes.append(now))
    monkeypatch.setattr(recycle.History, "load", classmethod(lambda cls: cls()))
    monkeypatch.setattr(recycle.History, "save", lambda self, path=None: None)

    class Stop(threading.Event):  # set after two periods
        looks = 0

        def wait(self, timeout=None):
            self.looks += 1
            return self.looks > 2

    spec = parse_spec({**BASE, "health": RECYCLE_NOW})
    with open(tmp_path / "recycle.lock", "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX)  # the other pod's pass
        recycle.run_forever(lambda: spec, lambda namespace: RecordingKubernetes(), Stop())
    assert passes == []
    recycle.run_forever(lambda: spec, lambda namespace: RecordingKubernetes(), Stop())
    assert len(passes) == 2


@pytest.mark.parametrize("saved", ["{not json", "[]", '{"recycles": 3}', '{"other": {}}', "\xff"])
def test_a_history_that_cannot_be_read_starts_a_new_one(tmp_path, capsys, saved):
    path = tmp_path / "history.json"
    path.write_bytes(saved.encode("latin-1"))
    assert recycle.History.load(path) == recycle.History()
    assert "starting a new history" in capsys.readouterr().err
