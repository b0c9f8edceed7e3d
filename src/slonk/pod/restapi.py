"""The REST API's pod: slurmrestd's own slurm.conf and what its s6 service (rootfs'
slurmrestd/run) listens on and serves, through s6-svscan's environment.

slurmrestd takes users' tokens (SLURM_JWT=daemon), and then speaks to slurmctld with those
alone: it cannot fetch the configuration slurmctld runs, which takes munge, and needs no key.
Its slurm.conf is rendered here from cluster.yaml as the controller renders its own
(slonk.config.render), read once at its start: the pod holds no secret at all."""

from __future__ import annotations

import os

from slonk.base import paths
from slonk.base.errors import SlonkError
from slonk.base.files import make_dir, write_atomically
from slonk.config.model import ClusterSpec
from slonk.config.render import render


def prepare(spec: ClusterSpec) -> str:
    if spec.restapi is None:  # slonk init refuses such a pod before its first step
        raise SlonkError("cluster.yaml has no restapi (the chart writes it with restapi.enabled)")
    conf = paths.SLURMRESTD_CONF
    make_dir(conf.parent, 0o755)
    write_atomically(conf, render(spec)["slurm.conf"], mode=0o644)
    # Without accounting there is no slurmdbd to answer the accounting half of the API.
    plugins = ["openapi/slurmctld", *(["openapi/slurmdbd"] if spec.accounting else [])]
    os.environ["SLURM_CONF"] = str(conf)
    os.environ.pop("SLURM_CONF_SERVER", None)  # the pod's env names one: this conf wins
    # No host: every address of the pod, IPv4 and IPv6.
    os.environ["SLONK_RESTAPI_LISTEN"] = f":{spec.restapi.port}"
    os.environ["SLONK_RESTAPI_PLUGINS"] = ",".join(plugins)
    return f"wrote {conf}; port {spec.restapi.port}, {' and '.join(plugins)}"
