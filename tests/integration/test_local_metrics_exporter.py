"""The `metrics` service in real pods, scraped over the pods' network as Prometheus does:
the controller's counts match what sinfo and squeue show, a worker serves its health checks'
results."""

from __future__ import annotations

import shlex
import time

from slonk.base import paths
from slonk.health import runner

from ..support.cluster import LocalCluster, service_pid, wait_for
from ..support.scrape import PORT, scrape, values


def test_the_controller_counts_what_slurm_shows(healthy: LocalCluster):
    controller = healthy.pod("slonk-controller-0")
    held = healthy.submit("--hold", "--partition=main", "--wrap", "true")
    controller.check_output("scontrol update nodename=slonk-cpu-1 state=drain reason=by-hand")
    try:
        families = scrape(healthy, "slonk-controller-0")
        sinfo = set(controller.check_output("sinfo --noheader --Node --format=%N").split())
        held_jobs = controller.check_output(
            "squeue --noheader --partition=main --states=PENDING --format=%r"
        ).split()
    finally:
        controller.run("scontrol update nodename=slonk-cpu-1 state=resume")
        controller.run(f"scancel {held}")
    assert sum(values(families, "slonk_nodes")) == len(sinfo) > 0
    assert values(families, "slonk_nodes", pool="cpu", state="drained", cause="human") == [1]
    assert sum(values(families, "slonk_jobs_pending", partition="main")) == len(held_jobs)
    assert values(families, "slonk_jobs_pending", partition="main", reason="JobHeldUser") == [
        held_jobs.count("JobHeldUser")
    ]
    assert values(families, "slonk_cpus", pool="cpu", state="unavailable")[0] > 0
    for source in ("nodes", "jobs", "sdiag"):
        assert values(families, "slonk_exporter_scrape_errors_total", source=source) == [0]
    assert values(families, "slonk_scheduler_cycles_total")[0] >= 0
    assert values(families, "slonk_rpcs_total", rpc="REQUEST_NODE_INFO")[0] >= 1


def test_a_worker_serves_its_health_checks(healthy: LocalCluster):
    # The results of the node's first interval run, once it has had one.
    families = wait_for(
        "the worker's interval results",
        lambda: (
            (found := scrape(healthy, "slonk-cpu-0"))
            and values(found, "slonk_health_check_ok", phase="interval")
            and found
        ),
    )
    ok = {s.labels["check"]: s.value for s in families["slonk_health_check_ok"]
          if s.labels["phase"] == "interval"}  # fmt: skip
    assert {"gpu", "storage", "dns"} <= set(ok)
    assert "controller" not in ok  # in no phase by default
    assert set(ok.values()) == {1.0}, ok  # the node is healthy (idle, undrained)
    assert {s.labels["node"] for s in families["slonk_health_check_ok"]} == {"slonk-cpu-0"}
    assert values(families, "slonk_exporter_scrape_errors_total", source="health") == [0]


# A job that floods its node's agent with idle connections (issue 28). It holds them until
# cancelled; its output says how many it opened.
FLOOD_JOB = """#!/usr/bin/env python3
import resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = [socket.create_connection(("127.0.0.1", %d), timeout=30)
        for _ in range(min(2000, hard - 64))]
print("holding", len(held), flush=True)
time.sleep(3600)
"""


def agent_usage(cluster: LocalCluster, pod: str) -> tuple[int, int]:
    """The worker agent's (threads, open descriptors), read from /proc in its pod."""
    pid = service_pid(cluster.pod(pod), "agent")
    out = cluster.pod(pod).check_output(
        f"grep '^Threads:' /proc/{pid}/status | cut -f2; ls /proc/{pid}/fd | wc -l"
    )
    threads, fds = out.split()
    return int(threads), int(fds)


def watch_checks(cluster: LocalCluster, pod: str) -> int:
    """How many checks the node's agent runs in a watch round, each in a thread of its own
    while the round runs (slonk.health.runner.run_checks)."""
    plan = runner.parse_plan(cluster.pod(pod).check_output(f"cat {paths.HEALTH_PLAN}").encode())
    return sum("watch" in check["phases"] for check in plan.checks.values())


def test_an_idle_connection_flood_from_a_job_leaves_the_agent_bounded_and_its_loops_running(
    healthy: LocalCluster,
):
    node = "slonk-cpu-0"
    scrape(healthy, node)  # the metrics task is up
    threads_before, fds_before = agent_usage(healthy, node)
    out = f"/home/demo/flood-{time.time_ns()}.out"
    job = healthy.submit(f"--nodelist={node}", f"--output={out}", "--wrap",
                         f"python3 -c {shlex.quote(FLOOD_JOB % PORT)}")  # fmt: skip
    try:
        held = wait_for(
            "the job's connections",
            lambda: healthy.pod("slonk-login-0").run(f"cat {out}").stdout.split()[1:],
        )
        flooded = time.time()
        threads, fds = agent_usage(healthy, node)
        # Its own port's share from loopback (8), whatever the job holds; a scrape from
        # elsewhere answers meanwhile, and the agent's loops go on.
        families = wait_for(
            "a watch round after the flood",
            lambda: (
                (found := scrape(healthy, node))
                and min(values(found, "slonk_health_check_last_run_timestamp_seconds",
                               phase="watch") or [0]) > flooded
                and found
            ),
        )  # fmt: skip
    finally:
        healthy.pod("slonk-controller-0").run(f"scancel {job}")
    assert int(held[0]) > 100, held
    # Bounded whatever the job holds, within what a watch round running at either look adds:
    # a thread a check, and what its probe holds as it starts (/dev/null, its output's and
    # Popen's error pipe's ends: 5). A clean-clone run saw 11 threads, then 15.
    round_ = watch_checks(healthy, node)
    assert threads <= threads_before + 3 + round_, (threads_before, threads, round_)
    assert fds <= fds_before + 8 + 2 + 6 * round_, (fds_before, fds, round_)
    assert values(families, "slonk_exporter_connections_refused_total", reason="busy")[0] >= (
        int(held[0]) - 8
    )
    up = {s.labels["task"]: s.value for s in families["slonk_agent_task_up"]}
    assert {"health-watch", "users-sync", "metrics", "config-watch"} <= set(up), up
    assert set(up.values()) == {1.0}, up
    failures = {s.labels["task"]: s.value for s in families["slonk_agent_task_failures_total"]}
    # A failure since the agent started (the cluster is the session's): its own words say why.
    said = [line for line in healthy.log(node).splitlines() if "failed (" in line]
    assert set(failures.values()) == {0.0}, (failures, said)
