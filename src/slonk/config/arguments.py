"""Arguments that name an account, a pod, a node or a path, checked as argparse reads them:
one that fails is refused naming the argument (exit 2), before anything runs. Each rule has
its one home in slonk.config (accounts, patterns); these only apply them."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from slonk.config import accounts, patterns


def path(value: str) -> Path:
    """A path a person names (a file to read, a folder to write): one line of text, so that
    every message naming it stays one line."""
    if not value or patterns.CONTROL_CHARACTERS.search(value):
        raise argparse.ArgumentTypeError(f"{accounts.show(value)}: empty, or a control character")
    return Path(value)


def add_values_files(parser: argparse.ArgumentParser, help: str) -> None:
    """`-f/--values FILE`, repeatable, as helm takes it: a list of checked paths."""
    parser.add_argument("-f", "--values", action="append", type=path, default=[], help=help)


def state_dir(value: str) -> Path:
    """Local mode's state dir, made absolute: plain characters only, as it reaches ssh's
    command line (which reads `%` as a token, and a space as a second file)."""
    try:
        return Path(accounts.check_path(os.path.abspath(value), "state dir"))
    except accounts.AccountError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def account(value: str) -> str:
    """A user to log in as: an account name, never an option of ssh's (`-oProxyCommand=`)."""
    try:
        return accounts.check_name(value, "user name")
    except accounts.AccountError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def named(pattern: str, what: str, most: int | None = None) -> Callable[[str], str]:
    """An argparse type for a name of `what`, whole-matching `pattern`, at most `most`
    characters (by default a DNS-1123 label's: pods, Slurm nodes and pools are named so)."""

    def check(value: str) -> str:
        from slonk.config.spec import DNS_LABEL_MAX

        longest = most or DNS_LABEL_MAX
        if len(value) > longest or not patterns.matches(pattern, value):
            raise argparse.ArgumentTypeError(
                f"{accounts.show(value)} is not {what} (at most {longest} characters: "
                f"{pattern.strip('^$')})"
            )
        return value

    return check


pod_name = named(patterns.DNS_LABEL, "a pod name")
node_name = named(patterns.DNS_LABEL, "a Slurm node's name")
pool_name = named(patterns.DNS_LABEL, "a node pool's name")
# `nodes history`: a Slurm node, a machine (a Kubernetes Node: a DNS name) or a GPU serial.
history_subject = named(patterns.SLURM_NAME, "a node, machine or GPU serial", 253)
