"""A local cluster of many workers (issue 17): they all register, one job runs on all of them,
`up` reports its nodes in one short line of counts, and `down` leaves nothing behind.

Lean for CI: small pods with nothing but slurmd (no login pod, directory, accounting, health
checks, syncer, exporter or NetworkPolicies); jobs are run as root in the controller pod. Not
timed: the figures are bench/local_scale.py's.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from slonk.local.network import Network

from ..support.cluster import slonk

WORKERS = 32
CONTROLLER = "slonk-controller-0"
LEAN = {
    "nodepools": {"cpu": {"replicas": WORKERS, "cpus": 1, "memoryMiB": 256}},
    "login": {"replicas": 0},
    "ldap": {"dev": {"enabled": False}},
    "accounting": {"enabled": False},
    "health": {"enabled": False},
    "syncer": {"enabled": False},
    "metrics": {"enabled": False},
    # By policy the controller pod accepts slurmctld's RPCs alone, so an srun there would
    # never hear from its steps; users' sruns, from login pods, are the policies' tests'.
    "networkPolicy": {"enabled": False},
}


def test_a_job_runs_on_every_one_of_32_workers(tmp_path: Path):
    state_dir = tmp_path / "state"
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(LEAN))
    local = ["--state-dir", str(state_dir)]
    nodes = {f"slonk-cpu-{i}" for i in range(WORKERS)}
    try:
        up = slonk("local", "up", "-f", str(values), *local, timeout=900)
        progress = [line.strip() for line in up.stdout.splitlines() if "nodes:" in line]
        # Counts by state, never a node's name; the last once every node is up.
        assert progress and not any("slonk-cpu" in line for line in progress), up.stdout
        assert progress[-1] == f"nodes: {WORKERS} idle", up.stdout
        ran = slonk(
            "local", "exec", CONTROLLER, *local, "--",
            "srun", f"--nodes={WORKERS}", "--ntasks-per-node=1", "hostname",
        )  # fmt: skip
        assert sorted(ran.stdout.split()) == sorted(nodes)
    finally:
        down = slonk("local", "down", "--purge", *local, check=False, timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert Network.for_state_dir(state_dir).namespaces() == []
    assert not [p for p in Path("/proc").glob("[0-9]*") if _names(p, state_dir)]


def _names(process: Path, state_dir: Path) -> bool:
    """Whether the process's command line names the state directory (a pod's init, a
    sidecar), a sign it outlived `down`."""
    try:
        return str(state_dir).encode() in (process / "cmdline").read_bytes()
    except OSError:
        return False
