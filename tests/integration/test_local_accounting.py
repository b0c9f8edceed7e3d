"""Accounting on a real local cluster: slurmdbd and MariaDB pods, jobs recorded with their
states and exit codes, sstat on a running job, the demo user's association, and no record
lost while the database or slurmdbd is down as jobs finish."""

from __future__ import annotations

import contextlib
import shlex
import uuid
from collections.abc import Iterator

from slonk.accounting.associations import DEFAULT_QOS, SUBMIT_SHARE
from slonk.config.render import DEFAULT_MAX_JOB_COUNT

from ..support.cluster import LocalCluster, wait_for
from ..support.users import bystander

DATABASE = "slonk-mariadb-0"
SLURMDBD = "slonk-slurmdbd-0"


def _records(cluster: LocalCluster, jobs: list[str]) -> dict[str, tuple[str, str]]:
    """{job id: (state, exit code)} of the jobs' allocations as sacct has them, as demo."""
    command = ["sacct", "-X", "-n", "-P", "-j", ",".join(jobs), "-o", "JobID,State,ExitCode"]
    out = cluster.user("demo").run(shlex.join(command))
    if out.rc != 0:
        return {}
    rows = [line.split("|") for line in out.stdout.splitlines()]
    return {row[0]: (row[1], row[2]) for row in rows if len(row) == 3 and row[0] in jobs}


def _finished(cluster: LocalCluster, jobs: list[str], want: dict[str, tuple[str, str]]) -> bool:
    return _records(cluster, jobs) == want


def _waiting_job(cluster: LocalCluster, release: str, code: int) -> str:
    """A job that runs until the file `release` exists in demo's home, then exits `code`."""
    script = f"until [ -e $HOME/{release} ]; do sleep 0.1; done; exit {code}"
    return cluster.submit("--output=/dev/null", "--wrap", script)


def _running(cluster: LocalCluster, jobs: list[str]) -> bool:
    states = cluster.jobs()
    return all(states.get(job) == "RUNNING" for job in jobs)


def test_the_accounting_pods_run_their_daemons(cluster: LocalCluster):
    status = cluster.slonk("status").stdout
    assert any(line.startswith(DATABASE) and "mariadbd" in line for line in status.splitlines())
    assert any(line.startswith(SLURMDBD) and "slurmdbd" in line for line in status.splitlines())
    conf = cluster.pod(SLURMDBD).file("/etc/slurm/slurmdbd.conf")
    assert (conf.user, conf.mode) == ("slurm", 0o600)


def test_jobs_appear_in_sacct_with_their_states_and_exit_codes(healthy: LocalCluster):
    user = healthy.user("demo")
    ok = user.check_output("sbatch --parsable --wait --output=/dev/null --wrap true").strip()
    failing = user.run("sbatch --parsable --wait --output=/dev/null --wrap 'exit 3'")
    assert failing.rc == 3, failing.stderr
    bad = failing.stdout.strip()
    want = {ok: ("COMPLETED", "0:0"), bad: ("FAILED", "3:0")}
    # slurmctld sends each record to slurmdbd as the job ends, not before sbatch returns.
    wait_for("both records in sacct", lambda: _finished(healthy, [ok, bad], want))
    account = user.check_output(f"sacct -X -n -P -j {ok} -o User,Account")
    assert account.strip() == "demo|research"


def _sstat_step(cluster: LocalCluster, job: str, memory: bool) -> list[str]:
    """The row sstat reports for the job's first step once its task runs ([] until then);
    with `memory`, only once the task's memory has been gathered (jobacct_gather)."""
    out = cluster.user("demo").run(f"sstat -n -P -a -j {job} -o JobID,NTasks,MaxRSS")
    rows = [line.split("|") for line in out.stdout.splitlines()] if out.rc == 0 else []
    step = [r for r in rows if len(r) == 3 and r[0] == f"{job}.0"]
    return step[0] if step and step[0][1] == "1" and (step[0][2] or not memory) else []


@contextlib.contextmanager
def _running_step(cluster: LocalCluster) -> Iterator[str]:
    """A job whose step runs until the test is done with it."""
    release = f".release-{uuid.uuid4().hex}"
    script = f"srun sh -c 'until [ -e $HOME/{release} ]; do sleep 0.1; done'"
    job = cluster.submit("--output=/dev/null", "--wrap", script)
    try:
        yield job
    finally:
        cluster.user("demo").run(f"touch $HOME/{release}")
    wait_for(f"job {job} to end", lambda: job not in cluster.jobs())


def test_sstat_reports_a_running_job(healthy: LocalCluster):
    with _running_step(healthy) as job:
        wait_for(f"sstat on job {job}'s running task", lambda: _sstat_step(healthy, job, False))


def test_sstat_reports_a_running_jobs_memory(healthy: LocalCluster):
    with _running_step(healthy) as job:
        wait_for(f"sstat on job {job}'s step", lambda: _sstat_step(healthy, job, False))
        # JobAcctGatherFrequency is 30 s: a sample is due within that.
        wait_for(f"job {job}'s memory", lambda: _sstat_step(healthy, job, True), timeout=45)


def test_sshare_shows_demos_association(healthy: LocalCluster):
    out = healthy.user("demo").check_output("sshare -n -P -u demo -o Account,User,RawShares")
    # sshare indents accounts by depth in the tree.
    rows = [[field.strip() for field in line.split("|")] for line in out.splitlines()]
    assert ["research", "demo", "1"] in rows, out
    accounts = healthy.pod("slonk-controller-0").check_output(
        "sacctmgr -n -P show user demo format=User,DefaultAccount"
    )
    assert accounts.strip() == "demo|research"


def test_no_record_is_lost_while_the_database_or_slurmdbd_is_down(healthy: LocalCluster):
    tag = uuid.uuid4().hex
    before = (
        healthy.user("demo")
        .check_output("sbatch --parsable --wait --output=/dev/null --wrap true")
        .strip()
    )
    done = {before: ("COMPLETED", "0:0")}
    wait_for("the first record", lambda: _finished(healthy, [before], done))
    jobs = [_waiting_job(healthy, f".release-{tag}-{i}", i) for i in range(4)]
    wait_for("the jobs to run", lambda: _running(healthy, jobs))
    want = {job: ("COMPLETED" if i == 0 else "FAILED", f"{i}:0") for i, job in enumerate(jobs)}
    want[before] = ("COMPLETED", "0:0")
    user = healthy.user("demo")
    # Two jobs end while the database is down, two while slurmdbd is.
    for pod, ending in ((DATABASE, jobs[:2]), (SLURMDBD, jobs[2:])):
        healthy.slonk("stop", pod)
        try:
            for job in ending:
                user.check_output(f"touch $HOME/.release-{tag}-{jobs.index(job)}")
            gone = lambda e=ending: not set(e) & healthy.jobs().keys()  # noqa: E731
            wait_for(f"{', '.join(ending)} to end", gone)
        finally:
            healthy.slonk("restart", pod)
    wait_for(
        "every record in sacct",
        lambda: _finished(healthy, [before, *jobs], want),
        timeout=120,
    )


def test_one_user_cannot_fill_the_job_table(healthy: LocalCluster):
    """demo holds as many jobs as the QOS lets one user (a job array of held tasks, each one
    job), is refused the next, and another user still submits."""
    other = bystander(healthy)
    controller = healthy.pod("slonk-controller-0")
    show = f"sacctmgr -n -P show qos {DEFAULT_QOS} format=MaxSubmitPU"
    limit = DEFAULT_MAX_JOB_COUNT // SUBMIT_SHARE
    wait_for("the QOS's per-user limit", lambda: controller.check_output(show) == str(limit))
    flood = ("--hold", "--output=/dev/null", "--wrap", "true")
    healthy.submit(f"--array=1-{limit}", *flood)
    refused = healthy.user("demo").run("sbatch " + shlex.join(flood))
    assert refused.rc != 0 and "job submit limit" in refused.stderr, refused.stderr
    try:
        assert healthy.submit(*flood, user=other)
    finally:
        controller.run(f"scancel --user={other}")
