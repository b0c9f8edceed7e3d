"""A user's own cron entries (scrontab, on by default) on a real local cluster: the entry
runs as the user's batch job at the next minute, and removing the table ends it."""

from __future__ import annotations

import uuid

from ..support.cluster import LocalCluster, wait_for

# Cron's resolution is a minute: the entry runs at the next one, then Slurm schedules it.
WITHIN_SECONDS = 150


def test_a_users_scrontab_entry_runs_as_their_job(healthy: LocalCluster):
    user = healthy.user("demo")
    marker = f"cron-{uuid.uuid4().hex[:8]}"
    table = f"{marker}.crontab"
    # An absolute path: Slurm's --get-user-env fails under the workers' masked /proc (README,
    # "Cron in Slurm"), so the job has no HOME of its login shell's.
    user.check_output(f"printf '* * * * * id -un > /home/demo/{marker}\\n' > {table}")
    try:
        user.check_output(f"scrontab {table}")
        assert marker in user.check_output("scrontab -l")
        ran = wait_for(
            f"{marker} written by the cron job",
            lambda: user.run(f"cat {marker}").stdout.strip(),
            timeout=WITHIN_SECONDS,
        )
        assert ran == "demo"
    finally:
        user.run("scrontab -r")
        user.run(f"rm -f {table} {marker}")
    # Removed, the table ends its pending run too.
    assert "no crontab for demo" in user.run("scrontab -l").stdout
    assert user.check_output("squeue --me -h -o %i").strip() == ""
