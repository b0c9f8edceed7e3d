"""`slonk watch-config`: apply a changed cluster.yaml to the running daemons, or refuse it.

kubelet swaps a mounted ConfigMap atomically (its `..data` symlink), so reading the file
gives either the old or the new document, never half of one; a content hash tells a change.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path

from slonk import paths
from slonk.config.render import render
from slonk.config.spec import ClusterSpec, SpecError, load_spec
from slonk.files import write_atomically

NODE_DEFINITIONS = ("NodeName=", "NodeSet=")


class ApplyError(RuntimeError):
    """Slurm did not take the new configuration; the previous files were put back."""


def log(message: str) -> None:
    print(f"slonk watch-config: {message}", file=sys.stderr, flush=True)


def fingerprint(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _nodes(slurm_conf: str) -> list[str]:
    return [line for line in slurm_conf.splitlines() if line.startswith(NODE_DEFINITIONS)]


def _signal_daemons(role: str, restart: bool) -> None:
    """Make the role's daemon read the new files. Slurm 22.05 cannot add or remove nodes
    with `scontrol reconfigure`: node changes restart the daemon (jobs keep running)."""
    if role == "controller":
        if restart:
            command = ["s6-svc", "-r", str(paths.SCAN_DIR / "slurmctld")]
        else:
            command = ["scontrol", "reconfigure"]
    elif role == "worker":
        command = ["s6-svc", "-r" if restart else "-h", str(paths.SCAN_DIR / "slurmd")]
    else:
        return  # login pods run only clients, which read the files on every call
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=30)


def update_node_programs(spec: ClusterSpec) -> None:
    """A worker's health plan and the programs slurm.conf names follow the spec too."""
    from slonk import init
    from slonk.health import runner

    init.install_job_programs(spec)
    plan = runner.plan_for(spec, init.pod_name())
    if plan:
        runner.write_plan(plan)
    else:
        paths.HEALTH_PLAN.unlink(missing_ok=True)


def apply(
    role: str, spec_path: Path = paths.CLUSTER_SPEC, conf_dir: Path = paths.SLURM_CONF_DIR
) -> str:
    """Validate, render and apply; raises SpecError (refused) or ApplyError (rolled back)."""
    spec = load_spec(spec_path)
    if role == "worker":
        update_node_programs(spec)
    new = render(spec)
    old = {name: (conf_dir / name).read_text() for name in new if (conf_dir / name).exists()}
    if new == old:
        return "no change to the Slurm configuration"
    restart = _nodes(new["slurm.conf"]) != _nodes(old.get("slurm.conf", ""))
    conf_dir.mkdir(parents=True, exist_ok=True)
    for name, text in new.items():
        write_atomically(conf_dir / name, text)
    try:
        _signal_daemons(role, restart)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as err:
        for name, text in old.items():
            write_atomically(conf_dir / name, text)
        detail = getattr(err, "stderr", None) or str(err)
        raise ApplyError(
            f"Slurm did not take it ({detail.strip()}); previous files restored"
        ) from err
    changed = ", ".join(sorted(n for n in new if new[n] != old.get(n)))
    return f"rewrote {changed}" + ("; restarted for new node definitions" if restart else "")


def watch(role: str, spec_path: Path = paths.CLUSTER_SPEC, interval: float = 1.0) -> None:
    applied = fingerprint(spec_path)
    reported = applied
    log(f"watching {spec_path} every {interval:g} s")
    while True:
        time.sleep(interval)
        current = fingerprint(spec_path)
        if current == applied or current is None:
            continue
        try:
            log(f"applied cluster.yaml change: {apply(role, spec_path)}")
            applied = reported = current
        except SpecError as err:
            # Invalid content stays invalid: refuse it once, keep the running configuration.
            log(f"refused cluster.yaml change, running configuration kept: {err}")
            applied = reported = current
        except ApplyError as err:
            # Valid content Slurm could not take now (say, slurmctld restarting): retry.
            if current != reported:
                log(f"could not apply cluster.yaml change, will retry: {err}")
                reported = current
