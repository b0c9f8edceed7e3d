"""The `slonk` command line: one subcommand per job, each a thin call into its module."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from slonk import __version__, chart
from slonk.config.render import write_config
from slonk.config.spec import SpecError, load_spec


def _chart_template(args: argparse.Namespace) -> int:
    values = chart.user_values(args.values, args.set, args.set_string)
    rendered = chart.render(args.chart or chart.default_chart(), values, args.name, args.namespace)
    sys.stdout.write(chart.manifest(rendered))
    return 0


def _render_config(args: argparse.Namespace) -> int:
    for path in write_config(load_spec(args.cluster), args.out):
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slonk", description="Slurm on Kubernetes")
    parser.add_argument("--version", action="version", version=f"slonk {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    chart_cmd = commands.add_parser("chart", help="the Helm chart, through Helm's Go library")
    chart_sub = chart_cmd.add_subparsers(dest="chart_command", required=True)
    template = chart_sub.add_parser("template", help="print the rendered manifests, as helm does")
    template.add_argument("chart", nargs="?", type=Path, help="chart directory (default: slonk's)")
    template.add_argument(
        "-f",
        "--values",
        action="append",
        type=Path,
        default=[],
        help="a values file; later files win",
    )
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

    render = commands.add_parser("render-config", help="write slurm.conf & co. from cluster.yaml")
    render.add_argument("--cluster", type=Path, required=True, help="the cluster.yaml spec")
    render.add_argument("--out", type=Path, required=True, help="directory to write into")
    render.set_defaults(run=_render_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (chart.ChartError, SpecError) as err:
        print(f"slonk: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
