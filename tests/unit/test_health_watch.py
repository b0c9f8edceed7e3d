"""The agent's watch phase and the job phases: the watch drains a node the round a check
fails and asks Slurm nothing while all pass; a job phase runs checks only where a site put
some, and a node whose plan gives it none pays for reading the plan alone."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from slonk.config.spec import HEALTH_CHECKS
from slonk.health import checks, drains, jobphase, probe, runner, watch
from slonk.health.runner import Result
from slonk.slurm.slurm_state import SlurmError

FAKE_GPU = Path(__file__).parents[1] / "fakes" / "fake-gpu"
ECC = (
    "slonk:gpu: GPU 1 (00000000:2A:00.0): 2 uncorrectable ECC errors; "
    "GPU 1 (00000000:2A:00.0): row remap pending, needs a reset"
)


class Node:
    """One worker's health state in a tmp dir, its fake GPUs, and what it asks of Slurm."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.state = root / "health"
        self.state.mkdir()
        self.plan = self.state / "plan.json"
        self.gpu = root / "gpu-scenario"
        monkeypatch.setenv("FAKE_GPU_SCENARIO", str(self.gpu))
        self.write_plan(["watch"])
        self.asked: list[list[str]] = []  # each call to Slurm: the failed checks' reasons
        boot = self.state / "boot.json"
        read_boot = runner.boot_results
        monkeypatch.setattr(runner, "boot_results", lambda path=boot: read_boot(path))
        monkeypatch.setattr(runner, "run", functools.partial(runner.run, state=self.state))
        self.log = root / "health.log"
        monkeypatch.setattr(drains, "LOG", self.log)
        monkeypatch.setattr(drains, "apply", self._apply)
        monkeypatch.setattr("slonk.health.checks.jobs_here", lambda node: True)

    def write_plan(self, phases: list[str], watch_seconds: float = 10) -> None:
        options = {
            **HEALTH_CHECKS["gpu"].options,
            "nvidiaSmi": f"{FAKE_GPU} nvidia-smi",
            "dmesg": f"{FAKE_GPU} dmesg",
            "expectedCount": 2,
        }
        checks = {"gpu": {"phases": phases, "timeoutSeconds": 5, "options": options}}
        node = runner.Node("slonk-gpu-0", 2, ("localhost",))
        runner.write_plan(runner.CheckPlan(node, True, checks, watch_seconds), self.plan)

    def _apply(self, name: str, results: list[Result], *limits: object) -> str:
        """drains.apply's stand-in: its undrain, limits and plan do not matter here."""
        self.asked.append([r.reason for r in results if not r.ok])
        return "drained" if self.asked[-1] else "resumed"


@pytest.fixture
def node(tmp_path, monkeypatch) -> Node:
    return Node(tmp_path, monkeypatch)


class Rounds:
    """The watch's stop event: lets it run `scenarios` rounds, setting the fake GPUs' state
    before each, and records how long it asked to wait after each."""

    def __init__(self, node: Node, scenarios: list[str]) -> None:
        self.node, self.scenarios, self.waits = node, list(scenarios), []
        node.gpu.write_text(self.scenarios.pop(0))

    def is_set(self) -> bool:
        return len(self.waits) > len(self.scenarios)

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        if not self.is_set():
            self.node.gpu.write_text(self.scenarios[len(self.waits) - 1])
        return self.is_set()


def _watch(node: Node, scenarios: list[str]) -> list[float]:
    rounds = Rounds(node, scenarios)
    watch.run(rounds, node.plan)  # type: ignore[arg-type]
    return rounds.waits


def test_a_healthy_node_asks_slurm_once_as_the_watch_starts_then_never(node):
    waits = _watch(node, ["healthy"] * 5)
    assert node.asked == [[]]  # the first round settles a drain from before a restart
    assert waits == [10] * 5


def test_a_fault_drains_the_round_it_appears_and_healing_resumes_the_round_after(node):
    waits = _watch(node, ["healthy", "healthy", "ecc", "ecc", "ecc", "healthy", "healthy"])
    # Asked again only when what fails changes: an outage on every node asks nothing more.
    assert node.asked == [[], [ECC], []]
    assert waits == [10] * 7


def test_a_round_that_cannot_tell_asks_nothing_and_the_pass_after_it_resumes(node, monkeypatch):
    """A check out of time starved of CPU (probe.Inconclusive) has no result: Slurm is not
    asked (the drain stays), and the round it passes again resumes the node."""
    real = checks.CHECKS["gpu"]

    def gpu(*args):
        if node.gpu.read_text() == "starved":
            raise probe.Inconclusive("nvidia-smi did not answer within 5 s, starved of CPU ...")
        return real(*args)

    monkeypatch.setitem(checks.CHECKS, "gpu", gpu)
    _watch(node, ["ecc", "starved", "starved", "healthy", "healthy"])
    assert node.asked == [[ECC], []]
    node.asked.clear()
    _watch(node, ["starved", "healthy", "starved", "healthy"])  # a new agent: asks once
    assert node.asked == [[]]


def test_until_slurm_answers_every_round_asks_again(node, monkeypatch):
    """A resume lost to a slurmctld that did not answer would leave the node drained."""
    answers = iter([False, False, True, True])

    def flaky(name: str, results: list[Result], *limits: object) -> str:
        node.asked.append([r.reason for r in results if not r.ok])
        if not next(answers):
            raise SlurmError("slurmctld does not answer")
        return "resumed"

    monkeypatch.setattr(drains, "apply", flaky)
    _watch(node, ["healthy"] * 6)
    assert node.asked == [[], [], []]  # two failed, the third took
    assert "could not update the node: slurmctld does not answer" in node.log.read_text()


def test_the_period_comes_from_the_plan_and_a_missing_plan_is_waited_for(node):
    node.write_plan(["watch"], watch_seconds=3)
    assert _watch(node, ["healthy"] * 2) == [3, 3]
    node.plan.unlink()
    assert _watch(node, ["ecc"] * 2) == [watch.NO_PLAN_WAIT_SECONDS] * 2


def test_a_broken_plan_is_said_and_looked_at_again(node, capsys):
    node.plan.write_text("{")
    assert _watch(node, ["healthy"] * 2) == [watch.NO_PLAN_WAIT_SECONDS] * 2
    assert "slonk health watch: JSONDecodeError" in capsys.readouterr().err


def test_a_watch_whose_rounds_keep_failing_gives_up_to_the_agent(node, capsys):
    """Said each time; the third in a row raises, for the agent to count and restart (a
    watch that cannot run must not look like one that finds nothing)."""
    node.plan.write_text("{")
    with pytest.raises(watch.WatchFailing, match="3 rounds in a row failed: JSONDecodeError"):
        _watch(node, ["healthy"] * 5)
    assert capsys.readouterr().err.count("slonk health watch: JSONDecodeError") == 3


def test_a_job_phase_runs_only_the_checks_a_site_put_there(node):
    node.gpu.write_text("ecc")
    assert jobphase.check("prolog", str(node.plan)) == 0  # gpu watches, it is not per job
    assert node.asked == []
    node.write_plan(["prolog", "watch"])
    assert jobphase.check("prolog", str(node.plan)) == 1
    assert node.asked == [[ECC]]
    assert jobphase.check("prolog", str(node.state / "absent.json")) == 0  # health off


def test_a_job_phase_with_no_checks_imports_no_health_code(node):
    src = str(Path(__file__).parents[2] / "src")
    code = (  # as the job programs run it: python -I -S
        f"import sys; sys.path.insert(0, {src!r}); from slonk.health import jobphase; "
        f"assert jobphase.check('prolog', {str(node.plan)!r}) == 0; "
        "print(sorted(m for m in sys.modules if m.startswith('slonk')))"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.replace("'", '"')) == [
        "slonk",
        "slonk.base",
        "slonk.base.places",
        "slonk.health",
        "slonk.health.jobphase",
    ]
