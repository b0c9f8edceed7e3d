"""Fair share: a user who has used the cluster waits behind one who has not, whatever order
they submitted in (priority/multifactor, with usage from slurmdbd). The session cluster
decays usage every minute (PriorityCalcPeriod), so a running job's usage counts within one."""

from __future__ import annotations

from ..support.cluster import LocalCluster, wait_for
from ..support.directory import ldapadd, person, wait_on_every_pod

RIVAL, RIVAL_UID = "rival", 5490  # no other test's uid: the directory outlives each test
NODE = "slonk-cpu-0"
FLOOD = 3


def _controller(cluster: LocalCluster, command: str) -> str:
    return cluster.pod("slonk-controller-0").check_output(command)


def _raw_usage(cluster: LocalCluster, user: str) -> int:
    command = f"sshare --noheader --parsable2 --users={user} --format=User,RawUsage"
    out = _controller(cluster, command)
    return sum(int(usage) for name, usage in (line.split("|") for line in out.splitlines()) if name)


def _has_association(cluster: LocalCluster, user: str) -> bool:
    out = _controller(cluster, f"sacctmgr --noheader --parsable2 show associations users={user}")
    return bool(out.strip())


def _add_rival(cluster: LocalCluster) -> None:
    """A second researcher in the directory (added once per session cluster)."""
    if not _has_association(cluster, RIVAL):
        if cluster.pod("slonk-login-0").run(f"getent passwd {RIVAL}").rc != 0:
            ldapadd(cluster, person(cluster, RIVAL, RIVAL_UID))
        wait_on_every_pod(cluster, RIVAL)
        wait_for(f"{RIVAL}'s association", lambda: _has_association(cluster, RIVAL))


def _fair_share(cluster: LocalCluster, user: str) -> float:
    command = f"sshare --noheader --parsable2 --users={user} --format=User,FairShare"
    out = _controller(cluster, command)
    return max(
        (float(v) for n, v in (line.split("|") for line in out.splitlines()) if n), default=0
    )


def _fair_share_factor(cluster: LocalCluster) -> dict[str, float]:
    """{job id: its weighted fair-share priority}, from sprio."""
    out = _controller(cluster, "sprio --noheader --format='%i %F'")
    return {job: float(value) for job, value in (line.split() for line in out.splitlines())}


def test_a_heavy_user_waits_behind_a_light_one(healthy: LocalCluster):
    # Usage is charged at each decay pass to the jobs then running (one that ended before
    # slurmctld's first pass is never charged): this one runs until one has counted it.
    # Cancelled only once its script runs on the node: a job cancelled while slurmd still
    # launched it (RUNNING in squeue already) left a step behind there, and the node looked
    # busy to later tests' health checks (CI run of f431a68).
    started = "$HOME/fairshare-started-$SLURM_JOB_ID"
    used = healthy.submit(
        "--ntasks=4", "--nodelist=slonk-cpu-1", "--output=/dev/null",
        "--wrap", f"touch {started}; sleep 300",
    )  # fmt: skip
    # The rival's association is made while demo's job runs: a new association's fair-share
    # factor is 0 until slurmctld's next priority pass, and one pass (every minute here) then
    # serves both, charging demo's usage and giving the rival a share.
    _add_rival(healthy)
    user = healthy.user("demo")
    wait_for(f"job {used} started", lambda: user.run(f"test -e fairshare-started-{used}").rc == 0)
    wait_for(
        f"a priority pass that charged demo and counted {RIVAL}",
        lambda: _raw_usage(healthy, "demo") > 0 and _fair_share(healthy, RIVAL) > 0,
        timeout=150,
    )
    _controller(healthy, f"scancel {used}")
    wait_for(f"job {used} gone", lambda: used not in healthy.jobs())

    # The node is busy while both flood it, demo first: the queue's order is priority's.
    blocker = _controller(
        healthy,
        f"sbatch --parsable --exclusive --nodelist={NODE} --output=/dev/null --wrap 'sleep 300'",
    ).strip()
    try:
        wait_for(f"job {blocker} running", lambda: healthy.jobs().get(blocker) == "RUNNING")
        flood = ("--exclusive", f"--nodelist={NODE}", "--output=/dev/null", "--wrap", "true")
        demo = [healthy.submit(*flood) for _ in range(FLOOD)]
        rival = [healthy.submit(*flood, user=RIVAL) for _ in range(FLOOD)]

        def factors() -> dict[str, float]:
            found = _fair_share_factor(healthy)
            return found if set(demo + rival) <= set(found) else {}

        found = wait_for("sprio for every job", factors)
        assert min(found[j] for j in rival) > max(found[j] for j in demo), found

        _controller(healthy, f"scancel {blocker}")
        flooding = set(demo + rival)
        wait_for("the flood to run", lambda: not flooding & set(healthy.jobs()), timeout=120)
        out = _controller(
            healthy,
            f"sacct --noheader --parsable2 -X --format=JobID,Start --jobs={','.join(flooding)}",
        )
        start = dict(line.split("|") for line in out.splitlines())
        # Seconds, so jobs starting in the same second tie: none of demo's started earlier.
        assert max(start[j] for j in rival) <= min(start[j] for j in demo), start
    finally:
        _controller(healthy, f"scancel {blocker}; scancel --user={RIVAL}")
