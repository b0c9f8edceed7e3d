"""The `slonk` command line: one subcommand per job, each a thin call into its module.

Pods run these commands as their entrypoint and as their services, so a command imports only
what it runs: each handler imports its modules itself, and only the command named on the
command line gets its arguments defined (local mode's import local mode's code, which a pod
never needs). tests/unit/test_layers.py holds this.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from slonk.base import paths
from slonk.base.errors import SlonkError
from slonk.config import arguments

if TYPE_CHECKING:
    pass


def _chart_template(args: argparse.Namespace) -> int:
    from slonk.kube import chart

    sys.stdout.write(
        chart.template(
            args.chart, args.values, args.set, args.set_string, args.name, args.namespace
        )
    )
    return 0


def _render_config(args: argparse.Namespace) -> int:
    from slonk.config.render import write_config
    from slonk.config.spec import load_spec

    for path in write_config(load_spec(args.cluster), args.out):
        print(path)
    return 0


def _init(args: argparse.Namespace) -> int:
    from slonk import init

    return init.main(args.role)


def _agent(args: argparse.Namespace) -> int:
    from slonk import pod_agent

    return pod_agent.run(args.role, args.cluster)


def _users_sync(args: argparse.Namespace) -> int:
    from slonk.config.spec import load_spec
    from slonk.users import sync

    return 0 if sync.run_once(load_spec(args.cluster), force=args.force) is not None else 1


def _hooks(args: argparse.Namespace) -> int:
    if args.hooks_command == "run":
        from slonk.hooks import dispatch

        return dispatch.run(args.phase)
    from slonk.hooks import revision

    status = revision.read_status()
    active, refused = status.get("active"), status.get("refused")
    print(f"active:  {active['revision']} since {active['since']}" if active else "active:  none")
    for note in (active or {}).get("unchecked", []):
        print(f"unchecked: {note}")
    if refused:
        print(f"refused: {refused['revision']} at {refused['at']}: {refused['reason']}")
    return 0


def _health(args: argparse.Namespace) -> int:
    from slonk.health import command

    return command.main(args.phase, as_json=args.json, drain=args.drain)


def _worker(args: argparse.Namespace) -> int:
    from slonk.base.identity import pod_name
    from slonk.pod import worker_stop

    # Kubernetes keeps no output of a preStop hook: its lines go to the pod's log (`kubectl
    # logs`) through PID 1's stderr. SIGTERM's `down` and init's `release` write there anyway.
    out = sys.stderr
    if args.worker_command == "stop":
        with contextlib.suppress(OSError):
            out = open("/proc/1/fd/2", "a")  # noqa: SIM115 (open for the command's life)

    def log(line: str) -> None:
        print(f"slonk worker {args.worker_command}: {line}", file=out, flush=True)

    slurm, name = worker_stop.Scontrol(), args.node or pod_name()
    if args.worker_command == "stop":
        return worker_stop.stop(slurm, name, args.timeout, log)
    if args.worker_command == "down":
        return worker_stop.down(slurm, name, log)
    return worker_stop.release(slurm, name, args.since, log)


def _power(args: argparse.Namespace) -> int:
    from slonk.slurm import power

    if args.power_command == "resume":
        # slurmctld's ResumeProgram (rootfs' bin/power-resume): the hostlist comes after `--`.
        if len(args.argv) != 1:
            raise power.PowerError("resume takes one hostlist: slonk power resume -- HOSTLIST")
        power.record_resume(args.argv[0])
        return 0
    print(" ".join(power.slurmd_flags(args.node)))
    return 0


def _add_chart(chart_cmd: argparse.ArgumentParser) -> None:
    chart_sub = chart_cmd.add_subparsers(dest="chart_command", required=True)
    template = chart_sub.add_parser("template", help="print the rendered manifests, as helm does")
    template.add_argument(
        "chart", nargs="?", type=arguments.path, help="chart directory (default: slonk's)"
    )
    arguments.add_values_files(template, "a values file; later files win")
    template.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="K=V",
        help="set values on the command line (helm --set syntax)",
    )
    template.add_argument(
        "--set-string",
        action="append",
        default=[],
        metavar="K=V",
        help="like --set, values kept as strings",
    )
    template.add_argument("--name", default="slonk", help="release name (default: slonk)")
    template.add_argument("-n", "--namespace", default="default")
    template.set_defaults(run=_chart_template)


def _add_render_config(render: argparse.ArgumentParser) -> None:
    render.add_argument(
        "--cluster", type=arguments.path, required=True, help="the cluster.yaml spec"
    )
    render.add_argument("--out", type=arguments.path, required=True, help="directory to write into")
    render.set_defaults(run=_render_config)


def _add_init(init: argparse.ArgumentParser) -> None:
    from slonk.pod.services import ROLE_SERVICES

    init.add_argument("--role", required=True, choices=tuple(ROLE_SERVICES))
    init.set_defaults(run=_init)


def _add_agent(agent: argparse.ArgumentParser) -> None:
    agent.add_argument("--role", required=True, choices=("controller", "worker", "login"))
    agent.add_argument("--cluster", type=arguments.path, default=paths.CLUSTER_SPEC)
    agent.set_defaults(run=_agent)


def _add_users(users: argparse.ArgumentParser) -> None:
    users_sub = users.add_subparsers(dest="users_command", required=True)
    users_sync = users_sub.add_parser("sync", help="write static and LDAP users into local files")
    users_sync.add_argument("--cluster", type=arguments.path, default=paths.CLUSTER_SPEC)
    users_sync.add_argument(
        "--force", action="store_true", help="accept a sync that removes more users than allowed"
    )
    users_sync.set_defaults(run=_users_sync)


def _add_hooks(hooks: argparse.ArgumentParser) -> None:
    from slonk.config.model import HOOK_PHASES

    hooks_sub = hooks.add_subparsers(dest="hooks_command", required=True)
    hooks_run = hooks_sub.add_parser("run", help="run the active revision's scripts for a phase")
    hooks_run.add_argument("phase", choices=HOOK_PHASES)
    hooks_sub.add_parser("status", help="the active revision, and the last refused one")
    hooks.add_argument("--cluster", type=arguments.path, default=paths.CLUSTER_SPEC)
    hooks.set_defaults(run=_hooks)


def _add_health(health: argparse.ArgumentParser) -> None:
    from slonk.config.model import CHECK_PHASES

    health_sub = health.add_subparsers(dest="health_command", required=True)
    health_run = health_sub.add_parser("run", help="run a phase's checks on this node")
    health_run.add_argument("--phase", choices=CHECK_PHASES, default="interval")
    health_run.add_argument("--json", action="store_true", help="print one JSON document")
    health_run.add_argument(
        "--drain",
        action="store_true",
        help="drain the node on failure, resume what slonk drained once it passes",
    )
    health.add_argument("--cluster", type=arguments.path, default=paths.CLUSTER_SPEC)
    health.set_defaults(run=_health)


def _syncer(args: argparse.Namespace) -> int:
    from slonk.align import syncer
    from slonk.config.spec import load_spec

    syncer.run(lambda: load_spec(args.cluster))
    return 0


def _add_syncer(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", type=arguments.path, default=paths.CLUSTER_SPEC)
    parser.set_defaults(run=_syncer)


def _metrics(args: argparse.Namespace) -> int:
    from slonk.metrics import serve

    print(serve.show(args.role, args.cluster), end="")
    return 0


def _add_metrics(metrics: argparse.ArgumentParser) -> None:
    metrics_sub = metrics.add_subparsers(dest="metrics_command", required=True)
    show = metrics_sub.add_parser("show", help="print one scrape's metrics")
    show.add_argument("--role", choices=("controller", "worker"), required=True)
    show.add_argument("--cluster", type=arguments.path, default=paths.CLUSTER_SPEC)
    metrics.set_defaults(run=_metrics)


def _align(args: argparse.Namespace) -> int:
    from slonk.align import report, syncer
    from slonk.align.kube import Cluster
    from slonk.config.spec import load_spec

    spec = load_spec(args.cluster)
    kube = Cluster(spec.namespace, spec.release, resync_seconds=60)
    kube.list_once()
    result = syncer.pass_once(spec, kube, fix=False)
    print(report.table(result))
    if args.fix:
        for line in syncer.converge(spec, kube, result):
            print(line)
    return 1 if result.drift else 0


def _add_align(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", type=arguments.path, default=paths.CLUSTER_SPEC)
    parser.add_argument("--fix", action="store_true", help="apply the syncer's actions once")
    parser.set_defaults(run=_align)


def _pool(args: argparse.Namespace) -> int:
    from slonk.align import pool
    from slonk.config.spec import load_spec

    print(pool.scale(load_spec(args.cluster), args.pool, args.replicas, args.timeout))
    return 0


def _nodes(args: argparse.Namespace) -> int:
    from slonk import node_report

    return node_report.main(args.nodes_command or "", getattr(args, "node", None))


def _add_nodes(parser: argparse.ArgumentParser) -> None:
    nodes_sub = parser.add_subparsers(dest="nodes_command")
    past = nodes_sub.add_parser("history", help="drains, resumes, recycles and quarantines")
    past.add_argument(
        "node",
        nargs="?",
        type=arguments.history_subject,
        help="a Slurm node, a machine or a GPU serial",
    )
    parser.set_defaults(run=_nodes)


def _add_pool(parser: argparse.ArgumentParser) -> None:
    pool_sub = parser.add_subparsers(dest="pool_command", required=True)
    scale = pool_sub.add_parser(
        "scale", help="lend a pool's highest nodes once idle, or return them"
    )
    scale.add_argument("pool", type=arguments.pool_name)
    scale.add_argument("replicas", type=int)
    scale.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="give up after this many seconds (default: wait)",
    )
    parser.add_argument("--cluster", type=arguments.path, default=paths.CLUSTER_SPEC)
    parser.set_defaults(run=_pool)


def _add_worker(worker: argparse.ArgumentParser) -> None:
    worker_sub = worker.add_subparsers(dest="worker_command", required=True)
    stop = worker_sub.add_parser(
        "stop", help="drain this node and wait for its jobs, then requeue them (preStop hook)"
    )
    stop.add_argument(
        "--timeout", type=float, required=True, help="seconds to wait for the jobs to end"
    )
    worker_sub.add_parser("down", help="mark this node down once slurmd stopped (SIGTERM)")
    release = worker_sub.add_parser(
        "release", help="lift the pod-stop drain once a slurmd started after --since registers"
    )
    release.add_argument("--since", type=int, required=True, help="epoch seconds")
    worker.add_argument(
        "--node", type=arguments.node_name, help="the Slurm node (default: this pod's name)"
    )
    worker.set_defaults(run=_worker)


def _add_power(power: argparse.ArgumentParser) -> None:
    power_sub = power.add_subparsers(dest="power_command", required=True)
    power_sub.add_parser(
        "resume", help="slurmctld's ResumeProgram: record the nodes asked back (-- HOSTLIST)"
    )
    power_sub.add_parser(
        "slurmd-flags", help="print the options a starting slurmd needs (its node powering up)"
    ).add_argument("node", type=arguments.node_name)
    power.set_defaults(run=_power)


def _add_mail(mail: argparse.ArgumentParser) -> None:
    # MailProg (rootfs' bin/mail) passes the recipient after `--`: it is --mail-user, a
    # user's to choose, and must never be read as an option of slonk's.
    mail.add_argument("--subject", required=True, help="the subject")
    mail.add_argument("--cluster", type=arguments.path, default=paths.CLUSTER_SPEC)
    mail.set_defaults(run=_mail)


def _mail(args: argparse.Namespace) -> int:
    from slonk.config.spec import load_spec
    from slonk.slurm import mail

    if len(args.argv) != 1:
        raise mail.MailError("mail takes one recipient: slonk mail --subject S -- RECIPIENT")
    settings = load_spec(args.cluster).mail
    if settings is None:
        raise mail.MailError(f"{args.cluster} has no mail relay (values mail.relay)")
    message = mail.compose(settings, args.subject, args.argv[0], os.environ)

    def give_up(*_: object) -> None:
        raise mail.MailError(f"gave up after {mail.GIVE_UP_SECONDS} s: relay {settings.relay}")

    signal.signal(signal.SIGALRM, give_up)
    signal.alarm(mail.GIVE_UP_SECONDS)
    try:
        mail.send(settings, message)
    finally:
        signal.alarm(0)
    return 0


def _add_local(local: argparse.ArgumentParser) -> None:
    from slonk.local import commands

    commands.define(local)


# name: (help, what defines its arguments and handler), in the order `slonk --help` lists them.
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "chart": ("the Helm chart, through Helm's Go library", _add_chart),
    "render-config": ("write slurm.conf & co. from cluster.yaml", _add_render_config),
    "init": ("a pod's entrypoint: prepare files, exec s6-svscan", _add_init),
    "agent": ("a pod's own loops in one process (runs under s6)", _add_agent),
    "users": ("users and groups on this node", _add_users),
    "hooks": ("job hooks from git", _add_hooks),
    "health": ("node health checks", _add_health),
    "syncer": ("keep Slurm and Kubernetes in agreement (runs under s6)", _add_syncer),
    "align": ("every node as Slurm and Kubernetes see it; exit 1 on drift", _add_align),
    "metrics": ("Prometheus metrics of the cluster or this node", _add_metrics),
    "pool": ("lend a node pool's nodes and give them back", _add_pool),
    "nodes": ("the fleet at a glance; `nodes history [NODE]`: what happened", _add_nodes),
    "worker": ("a worker pod's stop and return (preStop, SIGTERM)", _add_worker),
    "power": ("lent nodes as Slurm's power saving", _add_power),
    "mail": ("slurmctld's MailProg: a job's message to the relay (-- RECIPIENT)", _add_mail),
    "local": ("run the chart's pods on this machine (root)", _add_local),
}


class _Version(argparse.Action):
    """Looks the version up only when asked: package metadata costs start-up time."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from importlib.metadata import version

        print(f"slonk {version('slonk')}")
        parser.exit()


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: every command is listed, but only the one `argv` names gets its
    arguments (defining them may import its modules); with no argv, every command does."""
    parser = argparse.ArgumentParser(prog="slonk", description="Slurm on Kubernetes")
    parser.add_argument("--version", action=_Version, nargs=0, help="print the version")
    commands = parser.add_subparsers(dest="command", required=True)
    # slonk's own options take no value, so the first word that is no option is the command.
    chosen = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    for name, (help_text, define) in COMMANDS.items():
        command = commands.add_parser(name, help=help_text)
        if chosen in (None, name):
            define(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Everything after the first `--` is a command to run (exec, ssh), never slonk's options.
    split = argv.index("--") if "--" in argv else len(argv)
    args = build_parser(argv[:split]).parse_args(argv[:split])
    args.argv = argv[split + 1 :]
    try:
        return args.run(args)
    except SlonkError as err:  # a person's to fix: one line. Anything else is a bug.
        print(f"slonk: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
