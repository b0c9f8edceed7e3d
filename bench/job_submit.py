"""What job_submit.lua costs sbatch: slurm.conf gains JobSubmitPlugins=lua while a cluster has
no mail relay (values mail), so that a user asking for mail is told none will come.

The same bare pair (bench/bare_pair.py: slurmctld and slurmd with the configuration slonk
renders, minus slonk's programs) is started twice in one run: as rendered (the plugin on) and
with the plugin left out (slurmConf JobSubmitPlugins: null), each measured the same way. On
each, JOBS held jobs are submitted by one sbatch after another, first without --mail-type,
then with --mail-type=END (the plugin's message path), then cancelled. Prints one JSON
document: seconds per submission, and the plugin's ratio.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

JOBS = 300
ROUNDS = 2  # each measurement's best of this many: the machine is shared


def submissions(pair: Any, extra: str) -> float:
    """Seconds per `sbatch --hold` of one after another, the jobs cancelled after."""
    loop = (
        f"for i in $(seq {JOBS}); do sbatch --hold --output=/dev/null {extra} --wrap true "
        ">/dev/null 2>&1 || exit 1; done"
    )
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        done = pair.run(loop)
        elapsed = time.perf_counter() - started
        if done.returncode:
            raise RuntimeError(f"sbatch failed: {done.stderr.strip()}")
        pair.run("scancel --state=PENDING --user=root")
        best = min(best, elapsed / JOBS)
    return best


def measure(values: str) -> dict[str, Any]:
    from bare_pair import BarePair

    pair = BarePair(values)
    try:
        pair.start()
        said = pair.run("sbatch --hold --mail-type=END --wrap true").stderr.strip()
        pair.run("scancel --state=PENDING --user=root")
        return {
            "sbatch_seconds": round(submissions(pair, ""), 5),
            "sbatch_mail_type_seconds": round(submissions(pair, "--mail-type=END"), 5),
            "what_sbatch_said_with_mail_type": said,
        }
    finally:
        pair.stop()


def main() -> None:
    from bare_pair import ONE_NODE

    without = yaml.safe_load(ONE_NODE) | {"slurm": {"slurmConf": {"JobSubmitPlugins": None}}}
    result: dict[str, Any] = {
        "benchmark": "job_submit",
        "jobs": JOBS,
        "lua_plugin": measure(ONE_NODE),
        "no_plugin": measure(yaml.safe_dump(without)),
    }
    on, off = result["lua_plugin"], result["no_plugin"]
    result["ratio"] = {
        key: round(on[key] / off[key], 3) for key in ("sbatch_seconds", "sbatch_mail_type_seconds")
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
