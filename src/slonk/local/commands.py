"""`slonk local`: its commands' arguments, and each command, a call into local mode."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from slonk.config import arguments

if TYPE_CHECKING:
    from slonk.local.state import Cluster


def define(local: argparse.ArgumentParser) -> None:
    """`slonk local`'s commands and their arguments."""
    from slonk.local.state import DEFAULT_STATE_DIR

    local_sub = local.add_subparsers(dest="local_command", required=True)

    def sub(name: str, help_text: str) -> argparse.ArgumentParser:
        parser = local_sub.add_parser(name, help=help_text)
        parser.add_argument(
            "--state-dir",
            type=arguments.state_dir,
            default=DEFAULT_STATE_DIR,
            help=f"where the cluster's state lives (default: {DEFAULT_STATE_DIR})",
        )
        parser.set_defaults(run=run)
        return parser

    up = sub("up", "render the chart, start every pod, wait until all nodes are idle")
    upgrade = sub(
        "upgrade",
        "render again with the values in force and these; apply the ConfigMaps and pod set",
    )
    for parser in (up, upgrade):
        arguments.add_values_files(
            parser, "a values file over local mode's defaults; later files win"
        )
    up.add_argument(
        "--runtime",
        choices=("host", "podman"),
        default="host",
        help="run pods on the host's files (default) or from the chart's images with podman",
    )
    up.add_argument(
        "--prometheus",
        action="store_true",
        help="and Debian's Prometheus scraping every pod's metrics (prints its URL)",
    )
    sub("down", "stop every pod, remove namespaces; volumes and secrets kept").add_argument(
        "--purge", action="store_true", help="remove the state directory too"
    )
    sub("status", "pods, their processes and Slurm's node states")
    restart = sub("restart", "stop a pod and start it again, as a new container")
    restart.add_argument("pod", type=arguments.pod_name)
    sub("stop", "stop a pod (its preStop hook, SIGTERM, then SIGKILL)").add_argument(
        "pod", type=arguments.pod_name
    )
    sub("exec", "run a command in a pod: exec POD -- CMD...").add_argument(
        "pod", type=arguments.pod_name
    )
    sub("ssh", "ssh to the login pod as USER (-- CMD... runs a command)").add_argument(
        "user", type=arguments.account
    )
    sub("kubeconfig", "print an admin kubeconfig for the cluster's fake Kubernetes API (host only)")


def run(args: argparse.Namespace) -> int:
    from slonk.local.state import Cluster, check_state_dir

    # Root's alone, or no command reads or makes anything in it (slonk.local.state).
    state = check_state_dir(args.state_dir)
    if args.local_command in ("exec", "ssh"):
        # Only the state directory's files: scripts and tests run these by the thousand.
        return _enter(args, Cluster(state.resolve()))

    from slonk.local import cluster
    from slonk.local.nodes import printer

    progress = printer(sys.stdout)
    if args.local_command == "up":
        local = cluster.up(
            state, args.values, progress, runtime=args.runtime, with_prometheus=args.prometheus
        )
        login = local.pod_names("login")
        if login:
            print(f"Log in:  slonk local ssh demo --state-dir {local.state_dir}")
        if args.prometheus:
            from slonk.local import prometheus

            print(f"Prometheus:  {prometheus.url(local)}")
        return 0
    if args.local_command == "upgrade":
        from slonk.local import upgrade

        upgrade.upgrade(state, args.values, progress)
        return 0
    if args.local_command == "down":
        cluster.down(state, purge=args.purge, progress=progress)
        return 0
    if args.local_command == "status":
        print(cluster.status(state))
        return 0
    if args.local_command in ("restart", "stop"):
        cluster.restart(state, args.pod, stop_only=args.local_command == "stop")
        return 0
    from slonk.local import fake_apiserver  # kubeconfig

    print(fake_apiserver.kubeconfig(Cluster(state.resolve())), end="")
    return 0


def _enter(args: argparse.Namespace, local: Cluster) -> int:
    import subprocess

    from slonk.local.manifests import LocalModeError

    if args.local_command == "exec":
        if not args.argv:
            raise LocalModeError("exec needs a command: slonk local exec POD -- CMD...")
        argv = local.enter(args.pod, args.argv)
    else:
        argv = local.ssh(args.user, args.argv)
    return subprocess.run(argv, check=False, cwd="/").returncode
