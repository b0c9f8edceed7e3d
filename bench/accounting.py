"""Accounting, measured in one run. Prints one JSON document.

- 500 trivial jobs through the login pod (bench/local_cluster.py's workload) on a cluster
  with accounting off, then on the same shape with slurmdbd and MariaDB: the ratio is the
  price of a record per job;
- `sacct` over RECORDS job records: the accounting cluster's real ones (those 520 jobs),
  copied in SQL into the cluster's job table under new job ids until there are RECORDS
  (slurmctld records a job only once it is eligible: 10,000 real jobs would take half an
  hour here), then timed RUNS times as a user asks (`sacct -X` over every job of theirs
  since the cluster began) and as root over all users.
Like for like: both clusters are one controller and one 8-CPU node.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from local_cluster import workload

from slonk.local import cluster as local

RECORDS = 10_000
RUNS = 5
NODE = "nodepools: {cpu: {replicas: 1, cpus: 8, memoryMiB: 1024}}\n"
DATABASE_POD, DATABASE, JOBS_TABLE = "slonk-mariadb-0", "slurm_acct_db", "local_job_table"


def up(state: Path, values: str) -> local.Cluster:
    values_file = state.with_suffix(".yaml")
    values_file.write_text(values)
    return local.up(state, [values_file], progress=lambda m: None)


SACCT = ["sacct", "--noheader", "--parsable2", "-X", "--starttime=2020-01-01"]


def _timed(argv: list[str], stdin: str = "") -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=True)
    return time.perf_counter() - started, done.stdout


def top_up(cluster: local.Cluster) -> None:
    """Copy the job table's rows under new job ids until it holds RECORDS rows (MariaDB's
    root, over the database pod's socket)."""

    def sql(statement: str) -> str:
        argv = ["mariadb", "--batch", "--skip-column-names", DATABASE, "-e", statement]
        return _timed(cluster.enter(DATABASE_POD, argv))[1]

    columns = [line.split("\t")[0] for line in sql(f"SHOW COLUMNS FROM {JOBS_TABLE}").splitlines()]
    copied = [c for c in columns if c != "job_db_inx"]  # the table's own row number
    while (have := int(sql(f"SELECT COUNT(*) FROM {JOBS_TABLE}"))) < RECORDS:
        top = int(sql(f"SELECT MAX(id_job) FROM {JOBS_TABLE}"))
        values = ", ".join(f"`{c}` + {top}" if c == "id_job" else f"`{c}`" for c in copied)
        names = ", ".join(f"`{c}`" for c in copied)
        sql(
            f"INSERT INTO {JOBS_TABLE} ({names}) SELECT {values} FROM {JOBS_TABLE} "
            f"ORDER BY job_db_inx LIMIT {RECORDS - have}"
        )


def records(cluster: local.Cluster) -> int:
    """The demo user's job records, as they ask on the login pod."""
    return len(_timed(cluster.ssh("demo", SACCT))[1].splitlines())


def main() -> None:
    result: dict = {"benchmark": "accounting", "records": RECORDS}
    with tempfile.TemporaryDirectory(prefix="slonk-bench-accounting-") as tmp:
        plain, accounted = Path(tmp) / "plain", Path(tmp) / "accounted"
        try:
            cluster = up(plain, NODE + "accounting: {enabled: false}\n")
            result["jobs_without_accounting"] = workload(cluster.ssh("demo", ["sh", "-s"]))
        finally:
            local.down(plain, purge=True, progress=lambda m: None)
        try:
            cluster = up(accounted, NODE)
            result["jobs_with_accounting"] = workload(cluster.ssh("demo", ["sh", "-s"]))
            started = time.perf_counter()
            top_up(cluster)
            result["top_up_seconds"] = round(time.perf_counter() - started, 1)
            result["records_found"] = records(cluster)
            # A user on the login pod; root on the controller over every user's records.
            asks = {
                "user": cluster.ssh("demo", SACCT),
                "root_all_users": cluster.enter("slonk-controller-0", [*SACCT, "--allusers"]),
            }
            for who, argv in asks.items():
                timings = [_timed(argv)[0] for _ in range(RUNS)]
                result[f"sacct_seconds_{who}"] = {
                    "median": round(statistics.median(timings), 3),
                    "max": round(max(timings), 3),
                }
        finally:
            local.down(accounted, purge=True, progress=lambda m: None)
    without = result["jobs_without_accounting"]["jobs_per_second"]
    result["throughput_ratio_with_to_without"] = round(
        result["jobs_with_accounting"]["jobs_per_second"] / without, 2
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
