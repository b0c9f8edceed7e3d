"""Active checks in local mode (issue 32): the fake GPU's probe stands for the driver's
(slonk.local.fake_gpu). A new pod runs them before its slurmd starts (the gate); the
controller then submits them as Slurm jobs to idle nodes, which any user's job preempts; a
slow GPU drains its node `slonk:active:<check>` with the figure, and the node's recycled pod
stays out of service while its GPU stays slow.

A GPU whose corrected errors climb drains `slonk:trend:ecc-corrected`, one whose NVLink CRC
errors climb `slonk:trend:nvlink-crc`, and each stays drained for a person to lift.

Figures measured here are local mode's (two cores, fake GPUs, no cgroups)."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator

import pytest

from ..support.cluster import LocalCluster, cluster_of_its_own, wait_for

CONTROLLER = "slonk-controller-0"
NODES = ("slonk-gpu-0", "slonk-gpu-1", "slonk-gpu-2")
INTERVAL = 15  # each idle node is checked every 15 s: the tests wait on that, not more
SITE_CHECK = "/home/.site-check/diag"
BLOCK_CHECK = "/home/.site-check/fabric"
VALUES = {
    "nodepools": {
        "cpu": None,
        "gpu": {"replicas": 3, "cpus": 2, "memoryMiB": 1024, "gpus": {"count": 2, "type": "h100"}},
    },
    "partitions": {"main": {"pools": ["gpu"]}},
    "accounting": {"enabled": False},
    "metrics": {"enabled": False},
    "syncer": {"enabled": False},
    "health": {
        "active": {
            "intervalSeconds": INTERVAL,
            "startsPerMinute": 60,
            # The site's own check: a program in the shared /home, absent until a test writes it.
            "commands": {
                "diag": {"command": SITE_CHECK, "timeoutSeconds": 30},
                # One that spans the pool's three nodes (no topology: the pool is the group).
                "fabric": {"command": BLOCK_CHECK, "timeoutSeconds": 30, "span": "block"},
            },
        },
        "recycle": {"idleSeconds": 1, "periodSeconds": 2, "maxRecycles": 5},
        "trends": {
            "rules": {
                "ecc-corrected": {"maxIncrease": 100, "windowSeconds": 600},
                "nvlink-crc": {"maxIncrease": 100, "windowSeconds": 600},
            }
        },
    },
}
BOOT_RESULTS = "/run/slonk/health/boot.json"

active = cluster_of_its_own("active", VALUES, LocalCluster, idle=NODES)


def _scenario(cluster: LocalCluster, node: str, scenario: str) -> None:
    state = f"/home/.fake-gpu/{node}"
    command = f"rm -f {state}" if scenario == "healthy" else f"echo {scenario} > {state}"
    cluster.pod(CONTROLLER).check_output(f"mkdir -p /home/.fake-gpu && {command}")


@pytest.fixture
def healed(active: LocalCluster) -> Iterator[LocalCluster]:
    """Each test's GPU faults undone, and its nodes back in service, after it."""
    try:
        yield active
    finally:
        for node in NODES:
            _scenario(active, node, "healthy")
        active.wait_idle(NODES, timeout=300)


def _site_check(cluster: LocalCluster, body: str | None, path: str = SITE_CHECK) -> None:
    """A site's check program (root's, in the shared /home), or none."""
    script = f"printf '#!/bin/sh\\n%s\\n' {shlex.quote(body or '')} > {path} && chmod 755 {path}"
    command = f"rm -f {path}" if body is None else script
    cluster.pod(CONTROLLER).check_output(f"mkdir -p -m 755 /home/.site-check && {command}")


def _drained(cluster: LocalCluster, node: str, check: str, timeout: float = INTERVAL * 3) -> str:
    """Wait for `node` drained by the active check `check`: its reason."""
    prefix = f"slonk:active:{check}: "
    return wait_for(
        f"{node} drained by {check}",
        lambda: (reason := cluster.nodes()[node][1]).startswith(prefix) and reason,
        timeout=timeout,
    )


def _check_jobs(cluster: LocalCluster) -> dict[str, tuple[str, str]]:
    """The active checks' jobs Slurm shows (ended ones too): id -> (state, node)."""
    out = cluster.pod(CONTROLLER).check_output(
        "squeue --noheader --states=all --partition=slonk-active --format='%i %T %N'"
    )
    return {f[0]: (f[1], f[2] if len(f) > 2 else "") for f in map(str.split, out.splitlines())}


def test_a_new_pod_ran_its_active_checks_before_service(active: LocalCluster) -> None:
    for node in NODES:
        boot = json.loads(active.pod(node).check_output(f"cat {BOOT_RESULTS}"))
        ran = {r["check"]: r for r in boot if r["check"].startswith("active:")}
        # The site's check does not apply: its program is not on the node, so it did not run.
        assert sorted(ran) == [
            "active:diag",
            "active:fabric",
            "active:gpu-compute",
            "active:gpu-memory",
        ], boot
        assert ran["active:diag"]["detail"] == "not run: diag is not on this node"
        assert ran["active:fabric"]["detail"].startswith("not run here: it spans a block")
        assert all(r["ok"] for r in ran.values()), ran
        assert ran["active:gpu-memory"]["detail"] == "memory 3025, 3026 GB/s"
    conf = active.pod(CONTROLLER).check_output("scontrol show partition slonk-active --oneliner")
    for word in ("PriorityTier=0", "PreemptMode=CANCEL", "Hidden=YES", "AllowGroups=root"):
        assert word in conf.split(), conf


def test_a_users_job_preempts_a_running_check_at_once(healed: LocalCluster) -> None:
    """A long diagnostic holds a node; a user's job for that node starts within seconds, and
    the check's job ends PREEMPTED (it is tried again later, not judged)."""
    node = NODES[0]
    _scenario(healed, node, "long-check")
    wait_for(
        f"a check job running on {node}",
        lambda: ("RUNNING", node) in _check_jobs(healed).values(),
        timeout=INTERVAL * 3,
    )
    (check,) = [
        j for j, (state, at) in _check_jobs(healed).items() if (state, at) == ("RUNNING", node)
    ]
    submitted = time.monotonic()
    job = healed.submit(
        f"--nodelist={node}", "--gres=gpu:1", "--output=/dev/null", "--wrap", "sleep 30"
    )
    wait_for("the user's job running", lambda: healed.jobs().get(job) == "RUNNING")
    started = time.monotonic() - submitted
    print(f"user's job started {started:.1f} s after submission, preempting check job {check}")
    assert _check_jobs(healed)[check][0] == "PREEMPTED"
    assert "active" not in healed.nodes()[node][1]  # not judged: no drain
    healed.pod(CONTROLLER).run(f"scancel {job}")


def test_a_slow_gpu_drains_its_node_and_its_new_pod_stays_out_until_it_passes(
    healed: LocalCluster,
) -> None:
    node = NODES[1]
    _scenario(healed, node, "slow-memory")
    reason = _drained(healed, node, "gpu-memory")
    assert "GPU 1 1210 GB/s, under 2700 for NVIDIA H100 80GB HBM3" in reason, reason
    # Idle and drained for the machine: recycled, as the node history says. The new pod's
    # gate fails the same way, so its node registers drained for it: never in service with
    # the slow GPU.
    first = healed.slurmd_started(node)
    wait_for(
        "the recycle in the node history",
        lambda: any(
            e.node == node and e.event == "recycle" and e.cause == "active:gpu-memory"
            for e in healed.node_history()
        ),
    )
    wait_for("a new slurmd", lambda: healed.slurmd_started(node) not in ("", first), timeout=300)
    state, reason = healed.nodes()[node]
    assert "drain" in state.split("+") and reason.startswith("slonk:active:gpu-memory: "), state
    # Repaired: the next pod passes its gate and the node returns by itself.
    _scenario(healed, node, "healthy")
    healed.wait_idle((node,), timeout=300)


def test_a_sites_own_check_failing_drains_with_its_words(healed: LocalCluster) -> None:
    # Not NODES[0]: a user's job preempted its check (above), which waits RETRY_SECONDS.
    node, other = NODES[1], NODES[0]
    fails = f'[ "$(hostname)" != {node} ] || {{ echo GPU 1: Memory: Fail; exit 3; }}'
    _site_check(healed, fails)
    try:
        _drained(healed, node, "diag")
        said = "slonk:active:diag: diag exited with 3: GPU 1: Memory: Fail"
        assert healed.nodes()[node][1] == said
        assert "active" not in healed.nodes()[other][1]  # it passes there
        _site_check(healed, "echo all pass")  # mended: the next pod's gate passes it
        healed.wait_idle((node,), timeout=300)
    finally:
        _site_check(healed, None)  # gone: a check that no longer applies, whatever came before


def test_a_block_check_failing_over_one_node_drains_that_node_alone(healed: LocalCluster) -> None:
    """The site's program runs once over the pool's idle nodes and spans them (srun); it fails
    whenever NODES[2] is among them. Runs over pairs name NODES[2] alone (a pair of the others
    passes; NODES[2] fails beside each, and once more beside one); drained, it is recycled.
    Its new pod's node is held in the gate's reservation, out of users' reach, until a run over
    it passes: users' jobs on the other two keep that run from starting until the program is
    mended, and then a user's job waiting for the node starts there."""
    bad = NODES[2]
    spans = "srun --ntasks-per-node=1 true || exit 2"
    said = "busbw 12.5 GB/s, under 300"
    fails = (
        f'scontrol show hostnames "$SLURM_JOB_NODELIST" | grep -qx {bad} '
        f"&& {{ echo {said!r}; exit 1; }}; {spans}"
    )
    # Until now the program was on no node: a run looked, found none, and judged nobody.
    wait_for(
        "a run that found no program",
        lambda: "its program is not on every node it had" in healed.log(CONTROLLER, 0),
    )
    offset = healed.log_offset(CONTROLLER)
    _site_check(healed, fails, BLOCK_CHECK)
    blockers: list[str] = []
    began = time.monotonic()
    try:
        reason = _drained(healed, bad, "fabric", timeout=INTERVAL * 10)
        print(f"{bad} drained {time.monotonic() - began:.0f} s after the failing program")
        for partner in NODES[:2]:  # the search is over: its partners taken by users' jobs
            blockers.append(healed.submit(f"--nodelist={partner}", "--output=/dev/null",
                                          "--wrap", "sleep 600"))  # fmt: skip
        assert "fabric failed beside 2 nodes that pass without it (job " in reason, reason
        assert reason.endswith(f"): {said}"), reason  # the program's last line
        assert all("active" not in healed.nodes()[n][1] for n in NODES if n != bad)
        wait_for(
            "the search's end in the controller's log",
            lambda: (
                f"fabric over gpu: narrowed down in 5 runs, naming {bad}"
                in healed.log(CONTROLLER, offset)
            ),
        )
        log = healed.log(CONTROLLER, offset)
        assert f"fabric failed over {','.join(NODES)} (job " in log, log
        assert f"fabric names {bad}: drained: " in log, log
        first = healed.slurmd_started(bad)
        wait_for(
            "the recycle in the node history",
            lambda: any(
                e.node == bad and e.event == "recycle" and e.reason == reason
                for e in healed.node_history()
            ),
        )
        # The new pod's node: its drain lifted at boot, and held in the gate all the same.
        wait_for(
            f"{bad}'s new slurmd, in the gate",
            lambda: (
                healed.slurmd_started(bad) not in ("", first)
                and healed.nodes()[bad][0] == "idle+reserved"
            ),
            timeout=300,
        )
        print(f"{bad} back, held, {time.monotonic() - began:.0f} s after the failing program")
        user = healed.submit(f"--nodelist={bad}", "--output=/dev/null", "--wrap", "sleep 300")
        held = healed.pod(CONTROLLER).check_output(f"squeue --noheader -j {user} -o %T:%r")
        assert held.strip().startswith("PENDING:ReqNodeNotAvail"), held
        # Nor may a user's job ask for the gate's reservation.
        asked = healed.user().run(f"sbatch --reservation=slonk-gate -w {bad} --wrap true")
        assert asked.rc != 0 and "Access denied to requested reservation" in asked.stderr
        table = healed.pod(CONTROLLER).check_output("slonk nodes").splitlines()
        assert [bad, "idle+reserved", "gate"] in [line.split()[:3] for line in table], table
        # Mended, its partners free: the next run over it lets it out.
        _site_check(healed, spans, BLOCK_CHECK)
        healed.pod(CONTROLLER).check_output(f"scancel {' '.join(blockers)}")
        mended = time.monotonic()
        try:
            wait_for("the user's job on it", lambda: healed.jobs().get(user) == "RUNNING", 180)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{healed.log(CONTROLLER, offset)[-4000:]}") from None
        print(f"the user's job started on {bad} {time.monotonic() - mended:.0f} s after the mend")
        assert "slonk-gate" not in healed.pod(CONTROLLER).check_output("scontrol show res")
        assert f"gate: let out {bad}" in healed.log(CONTROLLER, offset)
        healed.pod(CONTROLLER).run(f"scancel {user}")
    finally:
        healed.pod(CONTROLLER).run(f"scancel {' '.join(blockers)}")
        _site_check(healed, None, BLOCK_CHECK)


def test_a_users_job_preempts_a_block_run_at_once(healed: LocalCluster) -> None:
    """A block run holds every idle node; a user's job for one of them starts within seconds,
    and the whole run ends PREEMPTED: not judged, its group tried again later."""
    _site_check(healed, "sleep 600", BLOCK_CHECK)
    try:
        wait_for(
            "a block run holding all three nodes",
            lambda: any(
                state == "RUNNING" and at == "slonk-gpu-[0-2]"
                for state, at in _check_jobs(healed).values()
            ),
            timeout=INTERVAL * 4,
        )
        (run,) = [
            j
            for j, (state, at) in _check_jobs(healed).items()
            if (state, at) == ("RUNNING", "slonk-gpu-[0-2]")
        ]
        submitted = time.monotonic()
        job = healed.submit(f"--nodelist={NODES[0]}", "--output=/dev/null", "--wrap", "sleep 30")
        wait_for("the user's job running", lambda: healed.jobs().get(job) == "RUNNING")
        print(f"user's job started {time.monotonic() - submitted:.1f} s after submission")
        assert _check_jobs(healed)[run][0] == "PREEMPTED"
        assert all("active" not in healed.nodes()[n][1] for n in NODES)
        healed.pod(CONTROLLER).run(f"scancel {job}")
    finally:
        _site_check(healed, None, BLOCK_CHECK)


# Each rule's counter rising on one node: (scenario, rule, what its drain says).
RISING = {
    NODES[0]: ("rising", "ecc-corrected",
               "ecc.errors.corrected.aggregate.total rose by more than 100 within 600 s"),
    # Read through slonk's NVML reader, over the fake's stand-in for the driver's library.
    NODES[1]: ("nvlink-rising", "nvlink-crc",
               "nvlink.errors.crc.total rose by more than 100 within 600 s"),
}  # fmt: skip


def _left_as_worn(node: str, log: str) -> bool:
    return any(
        f"not recycling {node} " in line and "is a worn board's" in line
        for line in log.splitlines()
    )


def test_a_gpu_counter_rising_drains_its_node_until_a_person_lifts_it(healed: LocalCluster) -> None:
    offset = healed.log_offset(CONTROLLER)
    for node, (scenario, _, _) in RISING.items():
        _scenario(healed, node, scenario)  # GPU 1's counter: 20 more a second
    for node, (_, rule, said) in RISING.items():
        wait_for(
            f"{node} drained by the trend rule {rule}",
            lambda node=node, rule=rule: healed.nodes()[node][1].startswith(
                f"slonk:trend:{rule}: GPU 1 "
            ),
        )
        assert healed.nodes()[node][1].endswith(said)
    reasons = {node: healed.nodes()[node][1] for node in RISING}
    # The counts stop rising (healed: the fake's counters fall to 0, a reset); the drains stay,
    # and the recycle loop leaves them.
    for node in RISING:
        _scenario(healed, node, "healthy")
    wait_for(
        "the recycle loop leaving both nodes",
        lambda: all(_left_as_worn(node, healed.log(CONTROLLER, offset)) for node in RISING),
    )
    assert {node: healed.nodes()[node][1] for node in RISING} == reasons
    for node in RISING:
        healed.pod(CONTROLLER).check_output(f"scontrol update nodename={node} state=resume")
