"""`slonk init --role R`: prepare the pod's files, then hand over to s6.

The steps are plain functions run in order; each logs one line. Any failure exits with a
message naming the file or key, before a daemon starts with a half-made configuration.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from slonk.accounting import database, slurmdbd
from slonk.base import paths
from slonk.base.errors import SlonkError
from slonk.base.files import make_dir, write_atomically
from slonk.base.identity import pod_name
from slonk.config import placement
from slonk.config.model import AccountingSettings
from slonk.config.render import JOB_CONTAINER, conf_server, render, slurm_settings
from slonk.config.spec import ClusterSpec, read_spec
from slonk.health import runner as health
from slonk.health import serials
from slonk.pod import (
    cgroups,
    fuse,
    mount_namespaces,
    restapi,
    secrets,
    services,
    sshd,
    worker_stop,
)
from slonk.pod.job_programs import install_job_programs
from slonk.pod.ldapdev import DevDirectory, seed_ldif
from slonk.slurm import rollout, statesave
from slonk.slurm.slurmctld import Slurmctld
from slonk.users import homes
from slonk.users import sync as users_sync
from slonk.users.directory import DirectoryError

BOOT_LDAP_WAIT_SECONDS = 5.0


class InitError(SlonkError):
    """The pod cannot start as configured; the message says what to fix."""


def log(message: str) -> None:
    print(f"slonk init: {message}", file=sys.stderr, flush=True)


def check_identity(spec: ClusterSpec, role: str, name: str) -> None:
    """The pod must be what cluster.yaml says it is: Slurm knows nodes by these names."""
    if role == "controller" and name not in spec.controller_names:
        raise InitError(
            f"pod {name!r} runs the controller, cluster.yaml names "
            f"{' and '.join(spec.controller_names)}"
        )
    if role == "worker" and spec.pool_of(name) is None:
        pools = ", ".join(p.name for p in spec.nodepools) or "none"
        raise InitError(f"pod {name!r} is not a node of cluster.yaml (pools: {pools})")
    if role in ("database", "slurmdbd"):
        accounting_of(spec, role)  # before any step changes anything
    if role == "restapi" and spec.restapi is None:
        raise InitError("cluster.yaml has no restapi: the chart writes it with restapi.enabled")


def prepare_slurm_config(spec: ClusterSpec, role: str) -> str:
    """Configless Slurm: the controller writes the files slurmctld alone reads; slurmd and
    every client (here and in ssh sessions, from the services' environment) fetch what
    slurmctld runs. A controller restarted with a configuration slurmctld refused before
    starts on the last one it accepted (slonk.slurm.rollout)."""
    server = conf_server(spec)
    os.environ["SLURM_CONF_SERVER"] = server  # s6-svscan's, so every service's
    if paths.CLIENT_SLURM_CONF.exists():
        paths.CLIENT_SLURM_CONF.unlink()  # it would shadow slurmctld's for every client
        log(f"removed {paths.CLIENT_SLURM_CONF}: clients take slurmctld's configuration")
    if role != "controller":
        return f"slurmd and clients fetch it from slurmctld at {server}"
    version = Slurmctld().version()
    files, note = rollout.boot_files(
        render(spec, placement.load()), version, rollout.Record(paths.ROLLOUT_RECORD)
    )
    if note:
        log(note)
    rollout.write_files(paths.SLURMCTLD_CONF_DIR, files)
    return f"wrote {paths.SLURMCTLD_CONF_DIR} for slurmctld ({version}), served at {server}"


def hide_other_users_processes() -> str:
    """Users' processes (their command lines carry tokens and paths) are theirs alone to see:
    the pod's /proc is remounted `hidepid=invisible` (Linux 5.8 or later, a procfs of the
    pod's own). It needs CAP_SYS_ADMIN and a runtime profile that allows the mount: where
    either is missing the pod goes on, and says so."""
    remount = ["mount", "-o", "remount,hidepid=invisible", "/proc"]
    done = subprocess.run(remount, capture_output=True, text=True, check=False)
    if done.returncode:
        said = " ".join(done.stderr.split()) or f"exit {done.returncode}"
        return f"other users' processes stay visible: /proc cannot be remounted ({said})"
    return "other users' processes hidden (/proc hidepid=invisible)"


def check_state() -> str:
    """Before slurmctld sees its state volume: this image's slurmctld must recover what is
    there (a chart upgrade may bring a Slurm too far from the state's), else the pod stops
    here, naming what to do, and the state and the workers' jobs are left as they are."""
    return statesave.check(paths.STATE_SAVE, Slurmctld().version())


def prepare_dirs(role: str) -> None:
    """What the role's daemons write to (the munge key's directory comes with the key)."""
    for path in ("/run/munge", "/var/lib/munge", "/var/log/munge"):
        make_dir(Path(path), 0o755 if path == "/run/munge" else 0o700, owner="munge")
    if role == "controller":
        make_dir(paths.STATE_SAVE, 0o700, owner="slurm")
    if role == "worker":
        make_dir(paths.SLURMD_SPOOL, 0o755)


def offer_shared_modulefiles() -> str:
    """/home/modulefiles on environment modules' search path (login shells, and jobs on the
    workers, which inherit the submitting shell's `module` or start login shells), once the
    users sync has made /home root's: only a directory root alone writes (homes.shared_dir),
    or every user's `module load` would run another user's modulefiles."""
    problem = homes.shared_dir(paths.SHARED_MODULEFILES.name)
    if problem:
        return f"none: {problem}"
    listed = paths.MODULES_PATH.read_text()
    entries = {line.split("#", 1)[0].strip() for line in listed.splitlines()}  # not comments
    if str(paths.SHARED_MODULEFILES) not in entries:
        write_atomically(paths.MODULES_PATH, f"{listed}{paths.SHARED_MODULEFILES}\n")
    return str(paths.SHARED_MODULEFILES)


def accounting_of(spec: ClusterSpec, role: str) -> AccountingSettings:
    if spec.accounting is None:
        raise InitError(f"role {role} needs accounting in cluster.yaml (accounting.enabled)")
    return spec.accounting


def register_users(spec: ClusterSpec) -> str:
    """Static and LDAP users into local files. The directory may be starting beside this pod:
    it gets a few seconds; after that the pod starts from the last good sync (the snapshot
    on /home), or with the static users alone, and the periodic sync catches up."""
    deadline = time.monotonic() + BOOT_LDAP_WAIT_SECONDS
    while True:
        try:
            result, source = users_sync.sync(spec), "the directory"
            break
        except DirectoryError as err:
            if time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            log(f"LDAP sync failed: {err}")
        except users_sync.SyncRefused as err:
            log(f"LDAP sync refused: {err}")
        result, source = _users_without_directory(spec)
        break
    for warning in result.new_warnings:
        log(f"users: {warning}")
    return f"{len(result.users)} users, {len(result.groups)} groups from {source}"


def _users_without_directory(spec: ClusterSpec) -> tuple[users_sync.Result, str]:
    try:
        return users_sync.sync(spec, read=users_sync.last_good()), "the last good sync"
    except (DirectoryError, users_sync.SyncRefused) as err:
        log(f"starting with static users only: {err}")
        return users_sync.sync(replace(spec, ldap=None)), "static users only"


def boot_checks(plan: health.CheckPlan | None) -> str:
    """Before slurmd starts: the results stand for the pod's life, and the first health run
    (slurmd's, before it registers) drains the node for any failure."""
    if plan is None:
        return "none planned"
    health.write_plan(plan)
    results = health.run(plan, "boot")
    health.save_boot_results(results)
    gpus = plan.checks.get("gpu")
    # For the node history: the first health run puts them on the Slurm node, none included
    # (a pod without the gpu check clears what an earlier pod on other GPUs left there).
    numbers = serials.query(gpus["options"], gpus["timeoutSeconds"]) if gpus else []
    serials.save(numbers)
    found = f"; GPU serials: {', '.join(numbers)}" if numbers else ""
    failed = [r for r in results if not r.ok]
    for result in failed:
        log(f"boot check failed: {result.line()}")
    if failed:
        return f"{len(failed)} of {len(results)} failed; the node registers drained{found}"
    return f"{len(results)} passed{found}"


def prepare_directory(spec: ClusterSpec) -> str:
    """The development directory's slapd.conf, and its seed on first start."""
    if spec.ldap_server is None:
        raise InitError("role ldap needs ldapServer in cluster.yaml (ldap.dev in values)")
    if not paths.LDAP_ADMIN_SECRET.is_file():
        raise secrets.MissingSecret(
            f"{paths.LDAP_ADMIN_SECRET}: no admin password; mount <release>-ldap-admin there"
        )
    server = spec.ldap_server
    try:
        directory = DevDirectory(
            suffix=server.suffix,
            admin_password=paths.LDAP_ADMIN_SECRET.read_text().strip(),
            data_dir=paths.LDAP_DATA,
            conf_dir=Path("/etc/ldap/slonk"),
        )
    except ValueError as err:
        raise InitError(f"{paths.LDAP_ADMIN_SECRET} or ldapServer.suffix: {err}") from err
    seeded = directory.prepare(seed_ldif(server.suffix, server.users, server.groups), "openldap")
    return f"seeded {len(server.users)} users" if seeded else "kept its data"


def optional_services(spec: ClusterSpec, role: str) -> tuple[str, ...]:
    """The s6 services a role runs beyond its own (services.ROLE_SERVICES), as cluster.yaml
    asks for them. The pod's loops (users sync, hooks, metrics, recycling) are tasks of its
    agent (slonk.pod_agent), which the controller and workers always run, and a login pod
    when it has one: the users sync, or srun's ports to keep."""
    login_agent = role == "login" and (spec.ldap or spec.srun_ports)
    extra: tuple[str, ...] = ("agent",) if login_agent else ()
    if role == "worker" and spec.ssh.workers:  # syslog: PAM's messages, in the pod's log
        extra += ("sshd", "syslog")
    if role == "controller" and spec.syncer:
        extra += ("syncer",)
    return extra


@dataclass(frozen=True)
class Pod:
    """What a step may read: the pod's spec, role and name."""

    spec: ClusterSpec
    role: str
    name: str

    @cached_property
    def health_plan(self) -> health.CheckPlan | None:
        return health.plan_for(self.spec, self.name) if self.role == "worker" else None


@dataclass(frozen=True)
class Step:
    """One step of a pod's start: run for `roles`, when `needed`; logs one line."""

    what: str
    roles: frozenset[str]
    action: Callable[[Pod], object]
    needed: Callable[[Pod], bool] = lambda pod: True


SLURM_ROLES = frozenset({"controller", "worker", "login"})
WORKER, LOGIN, RESTAPI = frozenset({"worker"}), frozenset({"login"}), frozenset({"restapi"})
# What verifies users' tokens when the REST API is on.
JWT_VERIFIERS = frozenset({"controller", "slurmdbd"})
# Every role's start, in order (a role's steps keep the table's order).
STEPS = (
    Step("prepared the development directory", frozenset({"ldap"}),
         lambda pod: prepare_directory(pod.spec)),
    Step("prepared the database", frozenset({"database"}),
         lambda pod: database.prepare(accounting_of(pod.spec, pod.role).database)),
    Step("checked slurmctld's state", frozenset({"controller"}), lambda pod: check_state()),
    Step("prepared the Slurm configuration", SLURM_ROLES,
         lambda pod: prepare_slurm_config(pod.spec, pod.role)),
    Step("installed the munge key", SLURM_ROLES | {"slurmdbd"},
         lambda pod: secrets.install_munge_key()),
    Step("installed the JWT key", JWT_VERIFIERS, lambda pod: secrets.install_jwt_key(),
         lambda pod: pod.spec.restapi is not None),
    Step("prepared sshd", SLURM_ROLES, lambda pod: sshd.prepare(pod.spec, pod.role),
         lambda pod: sshd.runs_sshd(pod.spec, pod.role)),
    Step("prepared state directories", SLURM_ROLES | {"slurmdbd"},
         lambda pod: prepare_dirs(pod.role)),
    Step("prepared slurmdbd", frozenset({"slurmdbd"}),
         lambda pod: slurmdbd.prepare(
             accounting_of(pod.spec, pod.role), pod.name, jwt=pod.spec.restapi is not None)),
    Step("prepared slurmrestd", RESTAPI, lambda pod: restapi.prepare(pod.spec)),
    Step("waited for the database", frozenset({"slurmdbd"}),
         lambda pod: slurmdbd.wait_for_database(accounting_of(pod.spec, pod.role))),
    Step("prepared the cgroup tree for jobs", WORKER, lambda pod: cgroups.prepare(),
         lambda pod: pod.spec.confinement == "cgroup"),
    Step("ordered mount namespace ids for jobs' own /tmp", WORKER,
         lambda pod: mount_namespaces.order_ids(),
         lambda pod: slurm_settings(pod.spec).get("JobContainerType") == JOB_CONTAINER),
    Step("looked at /proc", WORKER | LOGIN,  # where users' processes run
         lambda pod: hide_other_users_processes()),
    Step("registered users", SLURM_ROLES, lambda pod: register_users(pod.spec)),
    Step("offered the site's modulefiles", WORKER | LOGIN,  # jobs load them too
         lambda pod: offer_shared_modulefiles()),
    Step("looked at /dev/fuse", WORKER, lambda pod: fuse.open_to_users()),
    Step("ran boot health checks", WORKER, lambda pod: boot_checks(pod.health_plan),
         lambda pod: pod.health_plan is not None),
    Step("installed job programs", WORKER, lambda pod: install_job_programs(pod.spec),
         lambda pod: bool(pod.spec.job_phases or pod.spec.health)),
    Step("wrote s6 services", SLURM_ROLES | RESTAPI | {"ldap", "database", "slurmdbd"},
         lambda pod: services.write_scan_dir(pod.role, optional_services(pod.spec, pod.role))),
)  # fmt: skip


def steps_for(pod: Pod) -> list[Step]:
    """The steps a pod runs, in order."""
    return [step for step in STEPS if pod.role in step.roles and step.needed(pod)]


def run(role: str) -> None:
    """Every step of a pod's start, then exec s6-svscan (never returns on success)."""
    started = time.perf_counter()

    def timed(what: str, action: Callable[[], object]) -> object:
        t = time.perf_counter()
        result = action()
        detail = f": {result}" if isinstance(result, str) else ""
        log(f"{what}{detail} ({(time.perf_counter() - t) * 1000:.1f} ms)")
        return result

    name = pod_name()
    spec, started_on = read_spec(paths.CLUSTER_SPEC)
    log(f"read {paths.CLUSTER_SPEC} ({(time.perf_counter() - started) * 1000:.1f} ms)")
    paths.SPEC_HANDLED.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(paths.SPEC_HANDLED, started_on)
    check_identity(spec, role, name)
    pod = Pod(spec, role, name)
    for step in steps_for(pod):
        timed(step.what, lambda: step.action(pod))  # noqa: B023 (called at once)
    if role == "worker":  # lifts the drain a stopping pod may have left (slonk.pod.worker_stop)
        worker_stop.release_in_background(name)
    log(f"{role} {name} ready in {(time.perf_counter() - started) * 1000:.0f} ms; exec s6-svscan")
    services.exec_svscan(role)


def main(role: str) -> int:
    try:
        run(role)
    except SlonkError as err:  # what to fix, in the pod's log; a bug keeps its traceback
        log(f"error: {err}")
        return 1
    return 0
