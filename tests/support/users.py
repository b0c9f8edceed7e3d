"""A second researcher beside demo, for tests where one user must not deny service to
another: added once to the session cluster's directory (it outlives each test), and waited
for on every pod, with their Slurm association."""

from __future__ import annotations

from .cluster import LocalCluster
from .directory import ldapadd, person, wait_on_every_pod

BYSTANDER, BYSTANDER_UID = "bystander", 5491  # no other test's uid


def bystander(cluster: LocalCluster) -> str:
    """The second user's name, once they can log in and run jobs."""
    if cluster.pod("slonk-login-0").run(f"getent passwd {BYSTANDER}").rc != 0:
        ldapadd(cluster, person(cluster, BYSTANDER, BYSTANDER_UID))
    wait_on_every_pod(cluster, BYSTANDER)
    return BYSTANDER
