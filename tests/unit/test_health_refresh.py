"""The machine checks' refresher and the job phases that reuse its verdict: a fresh passing
verdict skips the checks; anything else (stale, future-dated, corrupt, another plan, a file
or directory someone else could write, a link) runs them as before, with the same drains."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from slonk import worker
from slonk.config.spec import HEALTH_CHECKS
from slonk.health import drains, jobphase, refresh, runner, verdict
from slonk.health.runner import Result

FAKE_GPU = Path(__file__).parents[1] / "fakes" / "fake-gpu"
ECC = (
    "slonk:gpu: GPU 1 (00000000:2A:00.0): 2 uncorrectable ECC errors; "
    "GPU 1 (00000000:2A:00.0): row remap pending, needs a reset"
)
LEFTOVER = (
    "slonk:gpu: GPU 0 (00000000:18:00.0): 40960 MiB still in use; "
    "process 48213 (python) left on a GPU with 40958 MiB"
)


class Node:
    """One worker's health state in a tmp dir, its fake GPUs, and the drains it asks for."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.state = root / "health"
        self.state.mkdir(mode=0o755)
        self.plan = self.state / "plan.json"
        self.verdict = self.state / "machine-checks"
        self.gpu = root / "gpu-scenario"
        monkeypatch.setenv("FAKE_GPU_SCENARIO", str(self.gpu))
        options = {
            **HEALTH_CHECKS["gpu"].options,
            "nvidiaSmi": f"{FAKE_GPU} nvidia-smi",
            "dmesg": f"{FAKE_GPU} dmesg",
            "expectedCount": 2,
        }
        checks = {"gpu": {"phases": ["prolog", "epilog"], "timeoutSeconds": 5, "options": options}}
        plan = runner.CheckPlan(runner.Node("slonk-cpu-0", 0, ("localhost",)), True, checks)
        runner.write_plan(plan, self.plan)
        self.drained: list[str] = []
        monkeypatch.setattr(runner, "load_plan", functools.partial(runner.load_plan, self.plan))
        boot = self.state / "boot.json"
        read_boot = runner.boot_results
        monkeypatch.setattr(runner, "boot_results", lambda path=boot: read_boot(path))
        monkeypatch.setattr(runner, "run", functools.partial(runner.run, state=self.state))
        monkeypatch.setattr(drains, "LOG", root / "health.log")
        monkeypatch.setattr(drains, "apply", self._apply)

    def _apply(self, name: str, results: list[Result], undrain: bool) -> str:
        self.drained += [r.reason for r in results if not r.ok]
        return "drained"

    def refresh(self) -> bool:
        return refresh.refresh_once(self.plan, self.verdict)

    def job(self, phase: str) -> int:
        return jobphase.check(phase, str(self.plan), str(self.verdict))


@pytest.fixture
def node(tmp_path, monkeypatch) -> Node:
    return Node(tmp_path, monkeypatch)


def test_a_fresh_passing_verdict_spares_the_prolog_its_checks(node):
    assert node.refresh()
    node.gpu.write_text("ecc")  # appears after the refresh: the prolog does not look
    assert node.job("prolog") == 0
    assert node.drained == []
    assert not (node.state / "results-prolog.json").exists()  # no check ran


def test_without_a_verdict_the_prolog_runs_its_checks_and_drains_as_ever(node):
    node.gpu.write_text("ecc")
    assert node.job("prolog") == 1
    assert node.drained == [ECC]


def test_a_failing_machine_check_gives_no_verdict_to_reuse(node):
    node.gpu.write_text("ecc")
    assert not node.refresh()
    assert verdict.passes("prolog", node.plan.read_bytes(), node.verdict.read_bytes()) is None
    assert node.job("prolog") == 1
    assert node.drained == [ECC]


def test_a_boot_failure_gives_no_verdict_to_reuse(node):
    runner.save_boot_results(
        [Result("gpu", False, "1 of 2 GPUs visible", 0.1)], node.state / "boot.json"
    )
    assert node.refresh()
    assert verdict.passes("prolog", node.plan.read_bytes(), node.verdict.read_bytes()) is None
    assert node.job("prolog") == 1
    assert node.drained == ["slonk:gpu: 1 of 2 GPUs visible"]


def test_the_epilog_still_checks_what_the_job_left_on_its_gpus(node):
    assert node.refresh()
    assert verdict.passes("epilog", node.plan.read_bytes(), node.verdict.read_bytes()) == ("gpu",)
    assert node.job("epilog") == 0
    node.gpu.write_text("leftover")
    assert node.job("epilog") == 1
    assert node.drained == [LEFTOVER]  # the whole epilog check's reason, as without a verdict


def _stale(node: Node) -> None:
    _rewrite(node, lambda data: _started(data, -verdict.MAX_AGE_SECONDS - 1))


def _future(node: Node) -> None:
    _rewrite(node, lambda data: _started(data, 60))


def _started(data: bytes, shift: float) -> bytes:
    head, _, rest = data.partition(b"\nstarted ")
    value, _, tail = rest.partition(b"\n")
    return head + b"\nstarted " + f"{float(value) + shift:.3f}".encode() + b"\n" + tail


def _rewrite(node: Node, change) -> None:
    data = node.verdict.read_bytes()
    node.verdict.unlink()
    node.verdict.write_bytes(change(data))
    node.verdict.chmod(0o644)


def _symlink(node: Node) -> None:
    real = node.state / "real"
    node.verdict.rename(real)
    node.verdict.symlink_to(real)


def _hard_link(node: Node) -> None:
    os.link(node.verdict, node.state / "second-name")


def _other_owner(node: Node) -> None:
    os.chown(node.verdict, 65534, 65534)


def _planted_in_open_directory(node: Node) -> None:
    node.state.chmod(0o777)


def _fifo(node: Node) -> None:
    node.verdict.unlink()
    os.mkfifo(node.verdict)


def _other_plan(node: Node) -> None:
    plan = json.loads(node.plan.read_text())
    plan["checks"]["gpu"]["options"]["maxUsedMemoryMiB"] = 0
    node.plan.write_text(json.dumps(plan))


@pytest.mark.parametrize(
    "spoil",
    [
        _stale,
        _future,
        lambda n: _rewrite(n, lambda d: d.replace(b"started ", b"started nan#")),
        lambda n: _rewrite(n, lambda d: d.replace(b"started 1", b"started inf")),
        lambda n: _rewrite(n, lambda d: d[:30]),
        lambda n: _rewrite(n, lambda d: b"\x00garbage" + d),
        lambda n: _rewrite(n, lambda d: d.replace(b"pass prolog", b"pass  prolog")),
        lambda n: n.verdict.chmod(0o666),
        lambda n: n.verdict.chmod(0o664),
        _symlink,
        _hard_link,
        _other_owner,
        _planted_in_open_directory,
        _fifo,
        _other_plan,
        lambda n: n.verdict.unlink(),
    ],
    ids=[
        "stale", "future-dated", "nan", "inf", "truncated", "corrupt", "odd-line",
        "world-writable", "group-writable", "symlink", "hard-link", "other-owner",
        "open-directory", "fifo", "other-plan", "missing",
    ],
)  # fmt: skip
def test_no_spoiled_verdict_lets_a_job_pass_a_failing_check(node, spoil):
    assert node.refresh()
    spoil(node)
    node.gpu.write_text("ecc")
    assert node.job("prolog") == 1
    assert node.drained == [ECC]


def test_a_verdict_too_large_is_not_read(tmp_path):
    big = tmp_path / "v"
    big.write_bytes(b"x" * 101)
    assert verdict.read_trusted(str(big), max_bytes=100) is None
    assert verdict.read_trusted(str(big), max_bytes=101) == b"x" * 101


def test_health_off_removes_the_verdict_and_the_phases_pass(node):
    assert node.refresh()
    node.plan.unlink()
    assert node.refresh()  # nothing failed: the refresher keeps its period
    assert not node.verdict.exists()
    assert node.job("prolog") == 0


def test_the_refresher_waits_without_a_plan_and_survives_a_bad_one(node, monkeypatch, capsys):
    stop = threading.Event()
    waits = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        if len(waits) == 1:
            node.plan.write_text("{not json")
        if len(waits) == 2:
            stop.set()
        return stop.is_set()

    node.plan.unlink()
    monkeypatch.setattr(stop, "wait", wait)
    refresh.run(stop, node.plan, node.verdict)  # returns once stopped: never raises
    assert waits == [refresh.PERIOD_SECONDS, 2 * refresh.PERIOD_SECONDS]
    assert not node.verdict.exists()
    assert "slonk health refresh:" in capsys.readouterr().err


def test_a_failing_node_is_looked_at_less_and_less_often(node, monkeypatch):
    """A probe stuck on a hung mount cannot be killed: one a period would fill the pod's
    process table. The job phases find no verdict and drain meanwhile."""
    stop = threading.Event()
    waits = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        if len(waits) == 8:
            node.gpu.write_text("")  # healed
        if len(waits) == 9:
            stop.set()
        return stop.is_set()

    node.gpu.write_text("ecc")
    monkeypatch.setattr(stop, "wait", wait)
    refresh.run(stop, node.plan, node.verdict)
    period = refresh.PERIOD_SECONDS
    assert waits == [
        *(min(period * 2**n, refresh.MAX_PERIOD_SECONDS) for n in range(1, 9)),
        period,
    ]
    assert verdict.passes("prolog", node.plan.read_bytes(), node.verdict.read_bytes()) == ()


def test_the_verdict_is_roots_alone(node):
    """When it was made would tell a job's user when the next look comes."""
    assert node.refresh()
    assert node.verdict.stat().st_mode & 0o777 == 0o600


def test_a_stopped_refresher_returns_at_once(node):
    stop = threading.Event()
    stop.set()
    refresh.run(stop, node.plan, node.verdict)
    assert not node.verdict.exists()


def test_the_prolog_program_starts_small(node):
    """The wrapper's interpreter flags, and what a passing prolog imports: no JSON, no
    regular expressions, no pathlib, no subprocess, no typing."""
    assert node.refresh()
    code = (
        "import sys\n"
        "from slonk.health import jobphase\n"
        f"assert jobphase.check('prolog', {str(node.plan)!r}, {str(node.verdict)!r}) == 0\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    arguments = worker.job_phase_arguments("prolog")
    assert arguments.startswith("-I -S -c ")
    where = str(Path(jobphase.__file__).parents[2])
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import sys; sys.path.append({where!r})\n{code}"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "FAKE_GPU_SCENARIO": str(node.gpu)},
    ).stdout.split()
    assert not {"json", "re", "pathlib", "subprocess", "typing", "threading"} & set(out)


def test_the_wrapper_runs_the_dispatcher(tmp_path):
    """What install_job_programs writes is a working program (here, a task prolog with no
    scripts: nothing to do)."""
    wrapper = tmp_path / "taskprolog"
    wrapper.write_text(
        f"#!/bin/sh\nexec {sys.executable} {worker.job_phase_arguments('taskProlog')}\n"
    )
    wrapper.chmod(0o755)
    assert subprocess.run([str(wrapper)], capture_output=True, text=True).returncode == 0


def test_an_idle_node_is_not_looked_at_until_a_job_reads_the_verdict(node, monkeypatch):
    """No job read the last verdict: the refresher waits instead of writing to /home for
    nobody. A job phase's read (atime past mtime, as relatime keeps it) starts it again."""
    stop = threading.Event()
    rounds = []
    real = refresh.refresh_once
    monkeypatch.setattr(refresh, "refresh_once", lambda *a: rounds.append(1) or real(*a))
    waits = 0

    def wait(seconds: float) -> bool:
        nonlocal waits
        waits += 1
        if waits == 1:
            past = node.verdict.stat().st_mtime_ns - 10**9
            os.utime(node.verdict, ns=(past, past))  # written a second ago, then:
        if waits == 3:
            assert node.job("prolog") == 0  # a job reads it
        if waits == 5:
            stop.set()
        return stop.is_set()

    monkeypatch.setattr(stop, "wait", wait)
    refresh.run(stop, node.plan, node.verdict)
    assert len(rounds) == 2  # the first, then once after the job: none while idle
