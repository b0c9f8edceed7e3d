"""Where things are: inside a pod (the chart's mount paths) and in a slonk installation."""

from __future__ import annotations

import os
from pathlib import Path

from slonk.base import places

# Mounted by the chart (charts/slonk/templates/_helpers.tpl, login.yaml, controller.yaml).
CLUSTER_SPEC = Path("/etc/slonk/cluster.yaml")
MUNGE_SECRET = Path("/var/run/secrets/slonk/munge/munge.key")
SSH_SECRET_DIR = Path("/var/run/secrets/slonk/ssh")
# ssh.trustedUserCAKeys: the site's user certificate authorities (slonk.pod.sshd checks them).
SSH_USER_CA = Path("/var/run/secrets/slonk/ssh-ca/ca.pub")
LDAP_ADMIN_SECRET = Path("/var/run/secrets/slonk/ldap-admin/password")
LDAP_BIND_SECRET = Path("/var/run/secrets/slonk/ldap-bind/password")
LDAP_CA_SECRET = Path("/var/run/secrets/slonk/ldap-ca/ca.crt")
LDAP_DATA = Path("/var/lib/ldap")
# Accounting: the database password (slurmdbd's pod and the chart's MariaDB), the CA that
# verifies a site's database over TLS, and the chart's MariaDB data on its volume.
ACCOUNTING_PASSWORD = Path("/var/run/secrets/slonk/accounting/password")
ACCOUNTING_CA = Path("/var/run/secrets/slonk/accounting-ca/ca.crt")
DATABASE_DATA = Path("/var/lib/mysql")
# The REST API (values restapi): the key slurmctld and slurmdbd sign and verify users' JSON
# Web Tokens with.
JWT_SECRET = Path("/var/run/secrets/slonk/jwt/jwt_hs256.key")
HOME = Path("/home")
# Environment modules every login pod offers beside the image's: a site adds tools to the
# shared /home; slonk init adds it to the search path (slonk.init.offer_shared_modulefiles).
SHARED_MODULEFILES = HOME / "modulefiles"
MODULES_PATH = Path("/etc/environment-modules/modulespath")
# A FUSE device plugin's node in a worker pod (values workers.fuseResource): Apptainer's.
FUSE_DEVICE = Path("/dev/fuse")

# Job hooks: git-sync's root (a volume shared with its sidecar), slonk's checked revisions,
# and the wrappers slurm.conf names as Prolog/Epilog.
GIT_ROOT = Path("/var/lib/slonk/git")
HOOKS_STATE = Path(places.HOOKS_STATE)
HOOK_BIN = Path("/run/slonk/bin")
# slurmd runs Prolog/Epilog with no PATH: their wrappers set this one, and a hook's
# `#!/usr/bin/env NAME` is looked up on it.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Health checks: the node's plan and its boot results (slonk.health.runner).
HEALTH_STATE = Path(places.HEALTH_STATE)
HEALTH_PLAN = Path(places.HEALTH_PLAN)

# Configless Slurm: the controller renders the configuration, and slurmctld (started with
# -f, see rootfs' slurmctld/run) is its only reader. Every other client and every slurmd
# fetches what slurmctld runs; a slurm.conf at the clients' default path would shadow that.
SLURMCTLD_CONF_DIR = Path("/etc/slurm/slurmctld")
# The files slonk renders in that dir.
CONFIG_FILES = (
    "slurm.conf",
    "topology.conf",
    "gres.conf",
    "cgroup.conf",
    "job_container.conf",
    "job_submit.lua",
)
CLIENT_SLURM_CONF = Path("/etc/slurm/slurm.conf")
# slurmctld's StateSaveLocation (its volume), and on it the last configuration slurmctld
# accepted and the last it refused.
STATE_SAVE = Path("/var/spool/slurmctld")
SLURMD_SPOOL = Path("/var/spool/slurmd")
# job_container/tmpfs's BasePath: each job's /tmp is a directory under it, on the worker
# container's own disk (the file system of the pod's /tmp, bound by its ephemeral storage),
# removed by slurmstepd when the job ends. slurmd makes it (AutoBasePath).
JOB_TMP_BASE = Path("/var/lib/slonk/job-tmp")
ROLLOUT_RECORD = STATE_SAVE / "slonk-config.json"
# Where the syncer found each node's pod, by Node label (slonk.config.placement).
PLACEMENT = STATE_SAVE / "slonk-placement.json"
# Pools `slonk pool scale` is taking nodes from: pool -> the replicas it will leave. The syncer
# drains the nodes above that as lent before the StatefulSet is scaled.
LENDING = STATE_SAVE / "slonk-lending.json"
# Lending nodes to Kubernetes (slonk.slurm.power): slurmctld's ResumeProgram (SlurmUser, rootfs'
# bin/power-resume, which runs `slonk power resume HOSTLIST`) records here which nodes Slurm
# asks back, for the syncer: JSON {"version": 1, "nodes": {"<node>": "<UTC time asked>"}},
# replaced atomically under a lock on STATE_SAVE; the syncer forgets a node once given back.
POWER_REQUESTS = STATE_SAVE / "slonk-power-requests.json"
# The reasons of drained nodes Slurm shows powered down, as slonk.slurm.power last saw them: Slurm
# with accounting storage forgets one as the node powers up (keeping its drain). Same format,
# {"version": 1, "nodes": {"<node>": "<reason>"}}; root's (the syncer's) alone.
POWERED_DOWN_REASONS = STATE_SAVE / "slonk-powered-down-reasons.json"
# Every drain, resume, recycle and quarantine of a node, keyed by its machine
# (slonk.health.history): one JSON object a line, appended under a lock, compacted to the
# newest lines.
NODE_HISTORY = STATE_SAVE / "slonk-node-history.jsonl"
# The Kubernetes Node each node's pod runs on, as the syncer last saw it: {"<node>": "<Node>"}.
MACHINES = STATE_SAVE / "slonk-machines.json"
# The nodes out of service as the syncer last saw them, and how far the history then went:
# {"offset": <NODE_HISTORY offset>, "nodes": {"<node>": "<reason>"}}
# (a syncer that starts again compares with these; the history may have been compacted).
NODES_SEEN = STATE_SAVE / "slonk-nodes-seen.json"
# The syncer's counts since its process started, rewritten after every pass (slonk.align.syncer).
SYNCER_STATS = Path("/run/slonk/syncer-stats.json")
# slurmctld's output as its s6 logger keeps it (rootfs' slurmctld/log/run): what it said.
SLURMCTLD_LOG = Path("/run/slonk/log/slurmctld/current")

# Written by `slonk init` inside the pod.
MUNGE_KEY = Path("/etc/munge/munge.key")
JWT_KEY = Path("/etc/slurm/jwt_hs256.key")  # SlurmUser's, 0400 (slonk.pod.secrets)
SLURMRESTD_CONF = Path("/etc/slurm/slurmrestd/slurm.conf")  # slonk.pod.restapi
SCAN_DIR = Path("/run/slonk/service")
# The fingerprint of the cluster.yaml the pod dealt with last: the one `slonk init` started on,
# then each config-watch applied or refused. config-watch applies any other, even one that
# came between init and its start, or while it was down (a failed task starts again).
SPEC_HANDLED = Path("/run/slonk/cluster.yaml.sha256")

# Shipped in every image from rootfs/.
SHARE = Path("/usr/share/slonk")
POWER_RESUME_PROGRAM = SHARE / "bin" / "power-resume"  # slurm.conf's ResumeProgram
MAIL_PROGRAM = SHARE / "bin" / "mail"  # slurm.conf's MailProg with a relay (values mail)

_REPO = Path(__file__).resolve().parents[3]


def _installed(env: str, in_repo: Path, in_image: Path, marker: str) -> Path | None:
    for candidate in (os.environ.get(env), in_repo, in_image):
        if candidate and (Path(candidate) / marker).exists():
            return Path(candidate)
    return None


def checkout() -> Path | None:
    """The source checkout slonk runs from, if it runs from one."""
    return _REPO if (_REPO / "pyproject.toml").exists() else None


def chart_dir() -> Path | None:
    """The chart slonk ships: $SLONK_CHART, the source checkout's, or the image's copy."""
    return _installed("SLONK_CHART", _REPO / "charts" / "slonk", SHARE / "chart", "Chart.yaml")


def rootfs_dir() -> Path | None:
    """The files every image carries (rootfs/): from a checkout, local pods layer its copy over
    their image's, so that a change needs no rebuild."""
    return _installed("SLONK_ROOTFS", _REPO / "rootfs", Path("/"), "usr/share/slonk/services")
