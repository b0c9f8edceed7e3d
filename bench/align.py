"""One syncer pass over a large cluster, from synthetic Slurm `--json` and API objects, in one
process. Prints one JSON document.

15,000 nodes in 20 pools; 1% of the Kubernetes Nodes cordoned, 0.5% NotReady, 0.5% annotated
`slonk.io/goal: drain`, half the nodes running a job. Measured: CPU seconds to parse Slurm's
JSON (the real record of a 24.11 node, tests/unit/data, copied per node) and to plan, and the
writes the pass asks for — Slurm commands and pod patches:
  first   the pods show no Slurm view yet: every pod is patched once, 300 nodes drained;
  settle  the drained nodes' pods show their new state;
  steady  the next pass, nothing changed: no write at all;
  churn   50 more Nodes cordoned: 50 drains, nothing else (their pods show it next pass).
Reads are one `scontrol show node --json` and one `squeue` a pass; the API is read by watches
(no call per pass). Public Slonk's alignment is a poll every 30 s making one API call per node
(its design as published, not measured here): 15,000 calls a pass.

With --local (root): a local cluster with the syncer's defaults, `kubectl cordon` of a worker's
Node timed until Slurm shows the node drained `slonk:k8s:cordoned`, RUNS times (uncordoned and
resumed in between); public Slonk's 30 s poll would average 15 s.
"""

from __future__ import annotations

import copy
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from slonk.align import plan as p
from slonk.slurm import reasons, slurm_state

DATA = Path(__file__).resolve().parents[1] / "tests" / "unit" / "data" / "scontrol-show-node.json"
POOLS, PER_POOL = 20, 750


def slurm_json(names: list[str]) -> str:
    record = json.loads(DATA.read_text())["nodes"][0]
    nodes = []
    for name in names:
        node = copy.deepcopy(record)
        node.update(name=name, hostname=name, state=["IDLE"], reason="", reason_set_by_user="")
        nodes.append(node)
    return json.dumps({"nodes": nodes, "errors": [], "warnings": []})


def objects(names: list[str], cordoned: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    pods, machines = {}, {}
    for i, name in enumerate(names):
        machine = f"gpu-host-{i}"
        pods[name] = {
            "metadata": {"name": name, "labels": {}, "annotations": {}},
            "spec": {"nodeName": machine, "tolerations": []},
            "status": {"phase": "Running"},
        }
        ready = "False" if i % 200 == 1 else "True"
        annotations = {p.GOAL: "drain", p.GOAL_REASON: "RMA"} if i % 200 == 2 else {}
        machines[machine] = {
            "metadata": {"name": machine, "labels": {}, "annotations": annotations},
            "spec": {"unschedulable": name in cordoned},
            "status": {"conditions": [{"type": "Ready", "status": ready}]},
        }
    return pods, machines


def timed(work: Any) -> tuple[Any, float]:
    start = time.process_time()
    result = work()
    return result, round(time.process_time() - start, 3)


RUNS = 10
WORKER = "slonk-cpu-0"


def cordon_to_drained() -> dict[str, Any]:
    from slonk.local import cluster as local

    def cause() -> reasons.Cause | None:
        node = local.node_states(cluster).get(WORKER)
        return node.cause if node is not None else None

    seconds = []
    with tempfile.TemporaryDirectory(prefix="slonk-bench-align-") as tmp:
        state = Path(tmp) / "state"
        try:
            cluster = local.up(state, progress=lambda m: None)
            config = Path(tmp) / "kubeconfig"
            command = [sys.executable, "-m", "slonk.cli", "local", "kubeconfig"]
            done = subprocess.run(
                [*command, "--state-dir", str(state)], capture_output=True, text=True, check=True
            )
            config.write_text(done.stdout)

            def kubectl(*args: str) -> None:
                subprocess.run(
                    ["kubectl", "--kubeconfig", str(config), *args], capture_output=True, check=True
                )

            for _ in range(RUNS):
                started = time.perf_counter()
                kubectl("cordon", f"local-{WORKER}")
                while cause() != reasons.Cause(reasons.K8S, "cordoned"):
                    time.sleep(0.05)
                seconds.append(round(time.perf_counter() - started, 2))
                kubectl("uncordon", f"local-{WORKER}")
                while cause() is not None:
                    time.sleep(0.05)
        finally:
            local.down(state, purge=True, progress=lambda m: None)
    return {"runs": RUNS, "median": statistics.median(seconds), "max": max(seconds), "all": seconds}


def main() -> None:
    settings = p.Settings("slonk", {f"pool{i:02}": PER_POOL for i in range(POOLS)})
    names = [n for n, _, _ in p.worker_nodes(settings)]
    text = slurm_json(names)
    cordoned = {n for i, n in enumerate(names) if i % 100 == 0}
    pods, machines = objects(names, cordoned)
    jobs = {n: 1 for i, n in enumerate(names) if i % 2}
    replicas = {f"slonk-pool{i:02}": PER_POOL for i in range(POOLS)}
    parsed, parse_seconds = timed(lambda: slurm_state.parse_nodes(text))
    slurm = {n.name: n for n in parsed}

    def snapshot() -> p.Snapshot:
        return p.Snapshot(slurm, jobs, pods, machines, replicas)

    def carried_out(result: p.Plan) -> None:
        """What a pass did, as the next snapshot sees it."""
        for patch in result.patches:
            metadata = pods[patch.pod]["metadata"]
            metadata["labels"].update(patch.labels)
            metadata["annotations"].update(patch.annotations)
        for action in result.actions:
            old = slurm[action.node]
            slurm[action.node] = slurm_state.NodeState(
                old.name, old.state, old.flags | {"DRAIN"}, action.reason, old.slurmd_started
            )

    passes = {}
    for name in ("first", "settle", "steady"):
        passes[name] = timed(lambda: p.plan(snapshot(), settings))
        carried_out(passes[name][0])
    for name in names[3::300]:  # 50 nodes, none cordoned, NotReady or drained by goal
        machines[pods[name]["spec"]["nodeName"]]["spec"]["unschedulable"] = True
    passes["churn"] = timed(lambda: p.plan(snapshot(), settings))
    report = {
        "nodes": len(names),
        "scontrol_json_bytes": len(text),
        "parse_cpu_seconds": parse_seconds,
        "passes": {
            name: {
                "plan_cpu_seconds": seconds,
                "slurm_commands": len(result.actions),
                "api_writes": len(result.patches),
                "api_reads": 0,
            }
            for name, (result, seconds) in passes.items()
        },
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "baseline_public_slonk": {"poll_seconds": 30, "api_calls_per_pass": len(names)},
    }
    if "--local" in sys.argv[1:]:
        report["cordon_to_drained_seconds"] = cordon_to_drained()
    json.dump(report, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
