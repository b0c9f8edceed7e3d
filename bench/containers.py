"""What a container costs a job's start, in one run on one local cluster (slonk local's
defaults: two workers with /dev/fuse, accounting on): the same command started bare, in an
Apptainer sandbox directory, and in a SIF (squashfuse), the image built by the user in a job
from tests/support/apptainer-image.sh. Prints one JSON document.

Two measures, each ROUNDS times per kind, kinds interleaved: an srun step from the login pod
(what a user waits for), and, within one step on a worker, the command started STARTS times
one after another (the container's own start, without Slurm's). Local mode's figures: two
cores shared by every pod, no cgroups.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from slonk.local import cluster as local

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "tests" / "support" / "apptainer-image.sh"
ROUNDS = 30
STARTS = 20
# The image has a shell and little more: each start runs its builtin true (srun reads a
# lone `:` as the separator of a heterogeneous job's parts).
KINDS = {
    "bare": "sh -c true",
    "sandbox": "apptainer --silent exec containers/image-dir sh -c true",
    "sif": "apptainer --silent exec containers/image.sif sh -c true",
}
NOW = "date +%s%N"


def _workload() -> str:
    lines = ["set -e", f"now() {{ {NOW}; }}"]
    lines.append("srun sh containers/build.sh containers </dev/null")
    lines.append("echo apptainer $(srun apptainer version </dev/null)")
    for _ in range(ROUNDS):
        for kind, command in KINDS.items():
            lines.append(
                f"t0=$(now); srun {command} </dev/null; echo srun {kind} $(( $(now) - t0 ))"
            )
    for kind, command in KINDS.items():
        loop = (
            f"t0=$({NOW}); for i in $(seq {STARTS}); do {command}; done; echo $(( $({NOW}) - t0 ))"
        )
        lines.append(f"echo starts {kind} $(srun sh -c '{loop}' </dev/null)")
    return "\n".join(lines) + "\n"


def _summary(nanoseconds: list[int]) -> dict[str, float]:
    ms = sorted(n / 1e6 for n in nanoseconds)
    return {
        "median_ms": round(statistics.median(ms), 1),
        "p90_ms": round(ms[int(len(ms) * 0.9) - 1], 1),
    }


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="slonk-bench-") as tmp:
        state_dir = Path(tmp) / "state"
        cluster = local.up(state_dir, [], progress=lambda m: None)
        try:
            subprocess.run(
                cluster.ssh("demo", ["mkdir -p containers && cat > containers/build.sh"]),
                input=BUILD.read_text(),
                text=True,
                check=True,
            )
            done = subprocess.run(
                cluster.ssh("demo", ["sh", "-s"]),
                input=_workload(),
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode:
                raise RuntimeError(f"the workload failed: {done.stderr.strip()[-2000:]}")
            said = done.stdout
        finally:
            local.down(state_dir, purge=True, progress=lambda m: None)
    rows = [line.split() for line in said.splitlines() if line.startswith(("srun ", "starts "))]
    steps = {kind: _summary([int(r[2]) for r in rows if r[:2] == ["srun", kind]]) for kind in KINDS}
    starts = {r[1]: round(int(r[2]) / STARTS / 1e6, 1) for r in rows if r[0] == "starts"}
    version = next(line.split()[1] for line in said.splitlines() if line.startswith("apptainer "))
    print(
        json.dumps(
            {
                "benchmark": "containers",
                "mode": f"slonk local: 2 cores, 2 workers, Apptainer {version} unprivileged",
                "srun_step": steps,
                "srun_step_added_median_ms": {
                    kind: round(steps[kind]["median_ms"] - steps["bare"]["median_ms"], 1)
                    for kind in ("sandbox", "sif")
                },
                "start_ms_within_a_step": starts,
                "rounds": ROUNDS,
                "starts": STARTS,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
