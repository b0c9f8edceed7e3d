"""Arguments that name an account, a pod, a node or a path are checked before anything runs,
and refused naming the argument, never with a traceback: `slonk local ssh USER` put USER on
ssh's command line unchecked, where `-oProxyCommand=...` runs a command as the host's root."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from slonk import cli
from slonk.local.manifests import LocalModeError
from slonk.local.state import Cluster, write_record

PODS = {
    "slonk-controller-0": {"role": "controller", "address": "10.73.0.10"},
    "slonk-cpu-0": {"role": "worker", "address": "10.73.0.11"},
    # The host's own loopback, so that the ssh below runs here, in the host's network.
    "slonk-login-0": {"role": "login", "address": "127.0.0.1"},
}


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A cluster's state as `up` leaves it, without its pods."""
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    write_record(Cluster(folder), {"pods": PODS})
    return folder


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What `slonk ARGV` says as argparse refuses it (exit 2, before anything runs)."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    return error.splitlines()[-1]


@pytest.mark.parametrize(
    "user",
    [
        "-oProxyCommand=touch {pwned};",  # a space: argparse takes it for a positional
        "-oProxyCommand=touch${{IFS}}{pwned}",
        "--oProxyCommand=touch {pwned}",
        "-F{pwned}",
        "alice -oProxyCommand=touch {pwned}",
        "root;touch {pwned}",
        "$(touch {pwned})",
        "alice@127.0.0.1",
        "Alice",
        "../../{pwned}",
        "alice\nslonk: ok",
        "",
    ],
)
def test_ssh_as_a_user_that_is_no_account_is_refused(state, capsys, user):
    pwned = state.parent / "pwned"
    argv = ["local", "ssh", user.format(pwned=pwned), "--state-dir", str(state), "--", "id"]
    said = _refused(argv, capsys)
    assert said.startswith("slonk local ssh: error: ")
    assert "user" in said  # the argument, or argparse's word for it missing
    assert not pwned.exists()


def test_an_ssh_option_after_the_separator_is_no_user(state, capsys):
    pwned = state.parent / "pwned"
    argv = ["local", "ssh", "--state-dir", str(state), "--", f"-oProxyCommand=touch {pwned};"]
    assert "required: user" in _refused(argv, capsys)
    assert not pwned.exists()


def test_the_api_refuses_such_a_user_too(state):
    with pytest.raises(LocalModeError, match=r"^user: '-oProxyCommand=x' is not a valid user"):
        Cluster(state).ssh("-oProxyCommand=x")


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's client")
def test_a_command_after_the_user_is_never_read_as_an_ssh_option(state):
    """ssh reads options again after the destination: without `--` before it, a command
    word `-oProxyCommand=...` was an option, run by the host's root."""
    pwned = state.parent / "pwned"
    argv = Cluster(state).ssh("alice", [f"-oProxyCommand=touch {pwned};"])
    ssh = argv[argv.index("ssh") :]  # what nsenter runs in the cluster's network: here, ours
    subprocess.run(ssh, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False)
    assert not pwned.exists()
    assert ssh[ssh.index("--") + 1] == "alice@127.0.0.1"


@pytest.mark.parametrize(
    ("argv", "argument"),
    [
        (["local", "exec", "../../../tmp/x", "--", "id"], "pod"),
        (["local", "exec", "-slonk-cpu-0 x", "--", "id"], "pod"),
        (["local", "restart", "slonk-cpu-0;reboot"], "pod"),
        (["local", "stop", "Slonk-cpu-0"], "pod"),
        (["local", "status", "--state-dir", "/tmp/a b"], "--state-dir"),
        (["local", "status", "--state-dir", "/tmp/%d"], "--state-dir"),
        (["local", "down", "--purge", "--state-dir", "/tmp/../"], "--state-dir"),
        (["worker", "--node", "slonk-cpu-[0-255]", "down"], "--node"),
        (["worker", "--node", "slonk-cpu-0,slonk-cpu-1", "down"], "--node"),
        (["power", "slurmd-flags", "a b"], "node"),
        (["pool", "scale", "cpu,gpu", "0"], "pool"),
        (["nodes", "history", "n1 n2"], "node"),
        (["render-config", "--cluster", "c.yaml\nslonk: fine", "--out", "o"], "--cluster"),
        (["chart", "template", "-f", ""], "-f/--values"),
    ],
)
def test_a_name_or_path_of_the_wrong_shape_is_refused_naming_the_argument(
    state, capsys, argv, argument
):
    if argv[0] == "local" and "--state-dir" not in argv:
        argv = [*argv[:2], "--state-dir", str(state), *argv[2:]]
    assert f"error: argument {argument}: " in _refused(argv, capsys)


def test_a_pod_of_the_right_shape_that_is_not_the_clusters_is_refused(state, capsys):
    argv = ["local", "exec", "slonk-cpu-9", "--state-dir", str(state), "--", "id"]
    assert cli.main(argv) == 1
    assert capsys.readouterr().err == (
        "slonk: error: no pod slonk-cpu-9: pods are slonk-controller-0, slonk-cpu-0, "
        "slonk-login-0\n"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["local", "ssh", "alice", "--state-dir", "{state}"],
        ["local", "ssh", "_svc-1"],
        ["local", "exec", "slonk-cpu-0", "--state-dir", "rel/ative"],
        ["worker", "--node", "slonk-cpu-0", "down"],
        ["power", "slurmd-flags", "slonk-gpu-12"],
        ["pool", "scale", "gpu", "0"],
        ["nodes", "history", "1650123456789"],  # a GPU serial
        ["nodes", "history", "ip-10-0-0-1.ec2.internal"],  # a machine
    ],
)
def test_names_of_the_right_shape_pass(state, argv):
    argv = [a.format(state=state) for a in argv]
    args = cli.build_parser(argv).parse_args(argv)
    if "--state-dir" in argv:
        assert args.state_dir == Path(os.path.abspath(argv[argv.index("--state-dir") + 1]))
