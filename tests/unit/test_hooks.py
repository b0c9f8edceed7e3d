"""Job hooks: which revisions may run, what the dispatcher does, and the local git-sync."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import stat
import subprocess
import time

import pytest

from slonk import cli
from slonk.base.paths import DEFAULT_PATH
from slonk.config.spec import HookSettings
from slonk.hooks import dispatch, revision
from slonk.hooks import tree as hook_tree
from slonk.hooks.revision import consider, problems, published, read_status, write_settings
from slonk.hooks.scripts import interpreter
from slonk.hooks.tree import MAX_DEPTH, MAX_ENTRIES, Refused
from slonk.local import gitsync
from slonk.local.gitsync import sync_once
from slonk.slurm import slurm_nodes

SETTINGS = HookSettings(
    phases={"prolog": "prolog.d", "epilog": "epilog.d"}, timeout_seconds=2, max_file_bytes=200
)
GOOD, BAD = "a" * 40, "b" * 40  # revisions are commit ids


def _script(folder, name, text, mode=0o755):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    path.chmod(mode)


def test_a_good_tree_passes(tmp_path):
    _script(tmp_path / "prolog.d", "10-sh", "#!/bin/sh\necho hi\n")
    _script(tmp_path / "prolog.d", "20-py", "#!/usr/bin/env python3\nprint('hi')\n")
    _script(tmp_path / "prolog.d", "30-env-s", "#!/usr/bin/env -S bash -e\necho hi\n")
    _script(tmp_path / "prolog.d", "40-arg", "#! /bin/sh -e\t\necho hi\n")
    _script(tmp_path / "epilog.d", "10-bash", "#!/bin/bash\n[[ -n x ]] && echo ok\n")
    _script(tmp_path / "epilog.d" / ".lib", "common.sh", "f() { :; }\n", 0o644)
    (tmp_path / "epilog.d" / ".common").symlink_to(".lib/common.sh")  # inside: fine
    (tmp_path / "prolog.d" / ".hidden").write_text("ignored")
    (tmp_path / "README").write_text("not a hook")
    (tmp_path / "elsewhere").symlink_to("/etc/shadow")  # outside the phases: never copied
    assert problems(tmp_path, SETTINGS) == []


@pytest.mark.parametrize(
    ("name", "text", "mode", "problem"),
    [
        ("a", "#!/bin/sh\necho\n", 0o644, "prolog.d/a: not executable"),
        ("b", "echo no interpreter\n", 0o755, "prolog.d/b: no #! line"),
        (
            "c",
            "#!/bin/bash\nif then fi\n",
            0o755,
            "prolog.d/c: line 2: syntax error near unexpected token `then'",
        ),
        ("d", "#!/usr/bin/python3\ndef f(:\n", 0o755, "prolog.d/d: line 2: invalid syntax"),
        ("e", "#!/bin/sh\n" + "#" * 300 + "\n", 0o755, "prolog.d/e: larger than 200 bytes"),
        # A script no job could run: it would fail every prolog and drain every node.
        (
            "f",
            "#!/bin/bash\r\necho hi\r\n",
            0o755,
            "prolog.d/f: #! line ends in a carriage return (CRLF line ends?)",
        ),
        (
            "g",
            "#!/usr/bin/no-such-shell\necho\n",
            0o755,
            "prolog.d/g: #! interpreter /usr/bin/no-such-shell does not exist in this image",
        ),
        (
            "h",
            "#!/usr/bin/env no-such-shell\necho\n",
            0o755,
            "prolog.d/h: #! interpreter no-such-shell is not on the jobs' PATH",
        ),
        (
            "i",
            "#!/usr/bin/python3\nx = 1\0\n",
            0o755,
            "prolog.d/i: ",
        ),  # Python's words for NUL bytes vary: what counts is no crash
    ],
)
def test_bad_scripts_are_named(tmp_path, name, text, mode, problem):
    _script(tmp_path / "prolog.d", name, text, mode)
    (found,) = problems(tmp_path, SETTINGS)
    assert found.startswith(problem)


@pytest.mark.parametrize(
    ("head", "problem"),
    [
        (b"#!/bin/bash\r\n", "#! line ends in a carriage return (CRLF line ends?)"),
        (b"#!/bin/bash\r", "#! line ends in a carriage return"),
        (b"#!\n", "#! line names no interpreter"),
        (b"#!  \t\n", "#! line names no interpreter"),
        (b"#!bash\n", "#! interpreter bash is not an absolute path"),
        (b"#!../../bin/sh\n", "#! interpreter ../../bin/sh is not an absolute path"),
        (b"#!/etc/passwd\n", "#! interpreter /etc/passwd is not an executable file"),
        (b"#!/usr/bin\n", "#! interpreter /usr/bin is not an executable file"),
        (b"#!/bin/sh\x1b[2J\n", "#! line has a control character: /bin/sh\\x1b[2J"),
        (b"#!/bin/sh\x00\n", "#! line has a control character"),
        (b"#!/bin/\xff\n", "#! line is not UTF-8"),
        (b"#!/bin/sh" + b" " * 300 + b"\n", "#! line longer than 255 bytes"),
        (b"#!/usr/bin/env\n", "#! env: name the program to run first"),
        (b"#!/usr/bin/env python3 -u\n", "#! env is given 'python3 -u' as one name"),
        (b"#!/usr/bin/env -i sh\n", "#! env: name the program to run first"),
        (b"#!/usr/bin/env FOO=1 sh\n", "#! env: name the program to run first"),
        (b"#!/usr/bin/env -S\n", "#! env: name the program to run first"),
        (b"#!/usr/bin/env ./x\n", "#! interpreter ./x is not an absolute path"),
        (b"#!/usr/bin/env -S bash -c 'x'\n", "#! env -S with quotes, escapes, variables"),
        (b"#!/usr/bin/env -S bash $X\n", "#! env -S with quotes, escapes, variables"),
        (b"#!/bin/sh\xe2\x80\xa8x\n", "#! line has a control character: /bin/sh\\u2028x"),
        (b"#!/usr/bin/env bash\n", [shutil.which("bash", path=DEFAULT_PATH)]),
        (b"#!/usr/bin/env -S python3 -u\n", [shutil.which("python3", path=DEFAULT_PATH), "-u"]),
        (b"#!/bin/sh", ["/bin/sh"]),  # no newline: the whole file is the line
        # The kernel hands the rest of the line, blanks trimmed, to the interpreter as one word.
        (b"#! /bin/bash  -e -u \t\n", ["/bin/bash", "-e -u"]),
        (b"#!/bin/bash\t--no-such-option\n", ["/bin/bash", "--no-such-option"]),
    ],
)
def test_the_interpreter_must_be_there_to_run_the_script(head, problem):
    if isinstance(problem, list):
        assert interpreter(head) == problem
    else:
        with pytest.raises(Refused) as refused:
            interpreter(head)
        assert str(refused.value).startswith(problem)


def test_env_looks_names_up_on_the_jobs_path(tmp_path):
    _script(tmp_path, "only-here", "#!/bin/sh\n")
    found = interpreter(b"#!/usr/bin/env only-here\n", str(tmp_path))
    assert found == [str(tmp_path / "only-here")]
    with pytest.raises(Refused, match="not on the jobs' PATH"):
        interpreter(b"#!/usr/bin/env only-here\n")


MARK = "touch {mark}\n"  # a script that leaves a mark if the check ever runs it


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        # /bin/sh is dash: bash's syntax passes `bash -n` and fails on every node.
        ("#!/bin/sh\narr=(1 2 3)\n", '2: Syntax error: "(" unexpected'),
        ("#!/usr/bin/env sh\n[[ -n x ]] && echo\n", None),  # `[[` is a command to dash: no fault
        # The #! argument: what the shell itself refuses, and what the check cannot vouch for.
        ("#!/bin/sh -k\necho\n", "/bin/sh: 0: Illegal option -k"),
        ("#!/bin/sh --login\necho\n", "/bin/sh: 0: Illegal option --"),
        ("#!/bin/bash -k\necho\n", None),
        (
            "#!/bin/bash --no-such-option\necho\n",
            "#! argument '--no-such-option': not one bash's syntax check can vouch for",
        ),
        ("#!/bin/sh -Z\necho\n", "#! argument '-Z': not one sh's syntax check can vouch for"),
        # The kernel passes one argument: `-e -u` is a word bash cannot read.
        ("#!/bin/bash -e -u\necho\n", "#! argument '-e -u': not one bash's"),
        ("#!/bin/bash -o pipefail\necho\n", "#! argument '-o pipefail': not one bash's"),
        ("#!/usr/bin/env -S bash -o pipefail\necho\n", "#! argument '-o': not one bash's"),
        # Arguments that would make `SHELL ARG -n SCRIPT` run the script or leave it unread.
        ("#!/bin/bash --rcfile\n" + MARK + "if then\n", "#! argument '--rcfile': not one bash's"),
        ("#!/bin/bash --init-file\n" + MARK, "#! argument '--init-file': not one bash's"),
        ("#!/bin/bash -c\n" + MARK + "if then\n", "#! argument '-c': not one bash's"),
        ("#!/bin/bash -s\nif then\n", "#! argument '-s': not one bash's"),
        ("#!/bin/bash -t\necho\nif then\n", "#! argument '-t': not one bash's"),
        ("#!/bin/sh -i\n" + MARK, "#! argument '-i': not one sh's"),
        ("#!/bin/bash --\n" + MARK, "#! argument '--': not one bash's"),
        ("#!/bin/bash -ex\n" + MARK + "if then\n", "line 3: syntax error"),
        ("#!/bin/bash -l\n" + MARK, None),
        ("#!/bin/bash --login\n" + MARK, None),
        ("#!/bin/sh +x\n" + MARK, None),
        ("#!/usr/bin/env -S bash -e -u\n" + MARK, None),
        ("#!/usr/bin/env -S bash -e -u\n" + MARK + "fi\n", "line 3: syntax error"),
        ("#!/usr/bin/python3 -u\nprint('hi')\n", None),
        ("#!/usr/bin/python3 -u\nprint 'hi'\n", "line 2: Missing parentheses in call to 'print'"),
        ("#!/usr/bin/python3 -c\nimport os\n", "#! argument '-c': not one python3's"),
        ("#!/usr/bin/python3 -mhttp.server\n", "#! argument '-mhttp.server': not one python3's"),
    ],
)
def test_scripts_are_checked_by_their_own_interpreter_and_arguments(tmp_path, text, problem):
    """The check runs what every node will run, on the script, and never runs the script."""
    mark = tmp_path / "ran"
    _script(tmp_path / "tree" / "prolog.d", "10-x", text.format(mark=mark))
    found = problems(tmp_path / "tree", SETTINGS)
    if problem is None:
        assert found == []
    else:
        (line,) = found
        assert line.startswith(f"prolog.d/10-x: {problem}"), line
    assert not mark.exists()


def test_the_check_gets_the_interpreters_own_command_line(tmp_path):
    """Interpreter, #! argument, -n, the script's absolute path, stdin from /dev/null, the
    jobs' environment: what is checked is what slurmd will run."""
    record = tmp_path / "argv"
    _script(
        tmp_path / "bin",
        "bash",
        f'#!/bin/sh\nprintf "%s\\n" "$@" "$PATH" "$BASH_ENV" > {record}\ncat >> {record}\n',
    )
    _script(tmp_path / "tree" / "prolog.d", "10-x", f"#!{tmp_path}/bin/bash -e\n")
    os.environ["BASH_ENV"] = "/the/watchers"
    try:
        assert problems(tmp_path / "tree", SETTINGS) == []
    finally:
        del os.environ["BASH_ENV"]
    copy = record.read_text().split("\n")
    assert copy[:2] == ["-e", "-n"]
    assert copy[2].endswith("/staging/prolog/10-x") and copy[2].startswith("/")
    assert copy[3:] == [DEFAULT_PATH, "", ""]  # no BASH_ENV, nothing read from stdin


def test_python_is_compiled_by_the_scripts_own_python(tmp_path):
    _script(tmp_path / "bin", "python2", '#!/bin/sh\necho "line 1: python2 says no" >&2\nexit 1\n')
    _script(tmp_path / "tree" / "prolog.d", "10-py", f"#!{tmp_path}/bin/python2\nprint('3')\n")
    assert problems(tmp_path / "tree", SETTINGS) == ["prolog.d/10-py: line 1: python2 says no"]


def test_other_interpreters_run_unchecked_and_the_status_says_so(tmp_path, monkeypatch, capsys):
    """`perl -c` runs BEGIN blocks: no check at all rather than one that runs the script."""
    mark, state = tmp_path / "ran", tmp_path / "state"
    _script(
        tmp_path / "tree" / "prolog.d",
        "10-perl",
        f'#!/usr/bin/perl\nBEGIN {{ open(my $f, ">", "{mark}") }}\nprint "hi\\n";\n',
    )
    _script(tmp_path / "tree" / "prolog.d", "20-sh", "#!/bin/sh\necho\n")
    assert consider(tmp_path / "tree", GOOD, SETTINGS, state)
    assert not mark.exists()
    assert read_status(state)["active"]["unchecked"] == [
        "prolog.d/10-perl: syntax not checked: perl has no check that runs nothing"
    ]
    monkeypatch.setattr(revision, "read_status", lambda: read_status(state))
    assert cli.main(["hooks", "status"]) == 0
    assert "unchecked: prolog.d/10-perl: syntax not checked" in capsys.readouterr().out


def _special(kind, path):
    if kind == "fifo":
        os.mkfifo(path)
    else:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        # Names reach Slurm's drain reasons and the logs: printable ASCII, or no line stays one.
        (
            lambda d: _script(d, "10-ok\r", "#!/bin/sh\n"),
            "prolog.d/10-ok\\x0d: name is not printable",
        ),
        (lambda d: _script(d, "10\nx", "#!/bin/sh\n"), "prolog.d/10\\x0ax: name is not printable"),
        (lambda d: _script(d, "\x1b]0;hi\x07", "#!/bin/sh\n"), "prolog.d/\\x1b]0;hi\\x07: name is"),
        (
            lambda d: _script(d, "30-x\u2028y", "#!/bin/sh\nexit 1\n"),
            "prolog.d/30-x\\u2028y: name is not printable ASCII",
        ),
        (lambda d: _script(d, "30-x\x85y", "#!/bin/sh\n"), "prolog.d/30-x\\x85y: name is not"),
        (lambda d: _script(d, "30-x\x1cy", "#!/bin/sh\n"), "prolog.d/30-x\\x1cy: name is not"),
        (lambda d: _script(d, "30-x\x0by", "#!/bin/sh\n"), "prolog.d/30-x\\x0by: name is not"),
        (lambda d: _script(d, "30-caf\u00e9", "#!/bin/sh\n"), "prolog.d/30-café: name is not"),
        (
            lambda d: _script(d / ".lib\u2029", "x", ""),
            "prolog.d/.lib\\u2029: name is not printable",
        ),
        (
            lambda d: (d / ".x").symlink_to(".y\u2028"),
            "prolog.d/.x: symlink target is not printable",
        ),
        (lambda d: _script(d, "-rf", "#!/bin/sh\n"), "prolog.d/-rf: name starts with '-'"),
        # `bash -n +x` reads +x as an option and the script from stdin: never checked.
        (lambda d: _script(d, "+x", "#!/bin/bash\nif then\n"), "prolog.d/+x: name starts with '+'"),
        (lambda d: _script(d / ".lib", "+O", ""), "prolog.d/.lib/+O: name starts with '+'"),
        (lambda d: _script(d, ".-x", "#!/bin/sh\n"), None),  # a dash later in a name is fine
        (lambda d: _script(d, "10 a:b,c=d", "#!/bin/sh\n"), None),  # printable ASCII is fine
        (
            lambda d: os.close(os.open(bytes(d / "10-") + b"\xff", os.O_CREAT, 0o755)),
            "prolog.d/10-\\xff: name is not printable ASCII",
        ),
        # Git checks out files; a hard link could bring in a file from elsewhere on the volume.
        (lambda d: (_script(d, ".a", ""), os.link(d / ".a", d / ".b")), "prolog.d/.a: a hard link"),
        (
            lambda d: (d / ".x").symlink_to("/etc/shadow"),
            "prolog.d/.x: symlink to /etc/shadow points outside its directory",
        ),
        (
            lambda d: (d / ".x").symlink_to("/dev/sda"),
            "prolog.d/.x: symlink to /dev/sda points outside its directory",
        ),
        (
            lambda d: (d / ".x").symlink_to("../../../../../../etc/passwd"),
            "prolog.d/.x: symlink to ../../../../../../etc/passwd points outside its directory",
        ),
        (lambda d: (d / ".x").symlink_to(".nothing"), "prolog.d/.x: symlink to .nothing points to"),
        (lambda d: (d / ".x").symlink_to(".x"), "prolog.d/.x: symlink to .x points to nothing"),
        (
            lambda d: (_special("fifo", d / ".f"), (d / ".x").symlink_to(".f")),
            "prolog.d/.x: symlink to .f points to a special file",
        ),
        (
            lambda d: (_script(d, ".t", "#!/bin/sh\n"), (d / "10-x").symlink_to(".t")),
            "prolog.d/10-x: not a regular file",
        ),
        (
            lambda d: _special("fifo", d / ".fifo"),
            "prolog.d/.fifo: not a regular file, directory or symlink",
        ),
        (lambda d: _special("socket", d / ".s"), "prolog.d/.s: not a regular file, directory"),
        (
            lambda d: _script(d, "10-suid", "#!/bin/sh\n", 0o4755),
            "prolog.d/10-suid: setuid or setgid",
        ),
        (lambda d: _script(d / ".lib", "x", "", 0o2755), "prolog.d/.lib/x: setuid or setgid bit"),
        (lambda d: (d / "10-dir").mkdir(), "prolog.d/10-dir: not a regular file"),
        (
            lambda d: [_script(d / ".many", f"{i}", "") for i in range(MAX_ENTRIES + 1)],
            f"prolog.d: more than {MAX_ENTRIES} entries",
        ),
        (
            lambda d: (d / "/".join(".d" for _ in range(MAX_DEPTH + 1))).mkdir(parents=True),
            f"directories nested deeper than {MAX_DEPTH}",
        ),
        (
            lambda d: [_script(d, f".{i}", "#" * 200) for i in range(9)],
            "prolog.d: more than 1600 bytes in all",
        ),
    ],
)
def test_what_git_content_may_hold(tmp_path, make, problem):
    """Each entry of a phase's directory, helpers too: the copy in slonk's store runs."""
    (tmp_path / "prolog.d").mkdir()
    make(tmp_path / "prolog.d")
    found = problems(tmp_path, SETTINGS)
    if problem is None:
        assert found == []
    else:
        assert any(problem in line for line in found), found


def _swap_dir_for_link(where, to):
    where.rename(where.with_name(where.name + ".old"))
    where.symlink_to(to)


def _swap_dir_for_dir(where, to):
    where.rename(where.with_name(where.name + ".old"))
    shutil.copytree(to, where)


def _swap_file_for_link(where, to):
    where.unlink()
    where.symlink_to(to / where.name)


def _swap_file_for_file(where, to):
    shutil.copy(to / where.name, where.with_name(".new"))
    os.replace(where.with_name(".new"), where)


@pytest.fixture
def racy_tree(tmp_path):
    """A good tree, and a root-only directory a writer in git-sync's volume would like a
    job to read: the same names, a secret in each file."""
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    for name in ("common.sh", "10-ok", "name-of-a-secret-file"):
        (secret / name).write_text("#!/bin/sh\n# SECRET\n")
    tree = tmp_path / "tree"
    _script(tree / "prolog.d", "10-ok", "#!/bin/sh\n. /x/.lib/common.sh\n")
    _script(tree / "prolog.d" / ".lib", "common.sh", "f() { :; }\n", 0o644)
    return tree, secret


def _leaked(state):
    files = [p for p in state.rglob("*") if p.is_file() and not p.is_symlink()]
    return [p for p in files if any(s in p.read_bytes() for s in (b"SECRET", b"of-a-secret"))]


@pytest.mark.parametrize(
    ("swap", "what"),
    [
        (_swap_dir_for_link, ".lib"),
        (_swap_dir_for_dir, ".lib"),
        (_swap_file_for_link, ".lib/common.sh"),
        (_swap_file_for_file, ".lib/common.sh"),
        (_swap_file_for_file, "10-ok"),
    ],
)
def test_an_entry_swapped_between_walk_and_copy_is_refused_not_copied(
    tmp_path, monkeypatch, racy_tree, swap, what
):
    tree, secret = racy_tree
    real_copy = revision.copy_entries

    def swap_then_copy(*args):
        swap(tree / "prolog.d" / what, secret)
        return real_copy(*args)

    monkeypatch.setattr(revision, "copy_entries", swap_then_copy)
    state = tmp_path / "state"
    assert not consider(tree, GOOD, SETTINGS, state)
    assert "prolog.d" in read_status(state)["refused"]["reason"]
    assert "changed while it was copied" in read_status(state)["refused"]["reason"]
    assert _leaked(state) == []


def test_a_phase_directory_swapped_after_it_was_opened_is_copied_as_walked(
    tmp_path, monkeypatch, racy_tree
):
    tree, secret = racy_tree
    real_copy = revision.copy_entries

    def swap_then_copy(*args):
        _swap_dir_for_link(tree / "prolog.d", secret)
        return real_copy(*args)

    monkeypatch.setattr(revision, "copy_entries", swap_then_copy)
    state = tmp_path / "state"
    assert consider(tree, GOOD, SETTINGS, state)
    assert sorted(p.name for p in (state / "active" / "prolog").iterdir()) == [".lib", "10-ok"]
    assert _leaked(state) == []


@pytest.mark.parametrize("swap", [_swap_dir_for_link, _swap_dir_for_dir])
def test_a_directory_swapped_while_walked_is_refused_and_never_listed(
    tmp_path, monkeypatch, racy_tree, swap
):
    tree, secret = racy_tree
    real_open = hook_tree.open_dir

    def open_after_a_swap(name, dir_fd=None):
        if name == ".lib":
            swap(tree / "prolog.d" / ".lib", secret)
        return real_open(name, dir_fd)

    monkeypatch.setattr(hook_tree, "open_dir", open_after_a_swap)
    state = tmp_path / "state"
    assert not consider(tree, GOOD, SETTINGS, state)
    assert "prolog.d" in read_status(state)["refused"]["reason"]
    assert "name-of-a-secret" not in (state / "status.json").read_text()
    assert _leaked(state) == []


def test_a_phase_directory_must_be_a_directory_of_the_repository(tmp_path):
    (tmp_path / "prolog.d").symlink_to("/etc")
    (tmp_path / "real").mkdir()
    (tmp_path / "hooks").symlink_to("real")
    _script(tmp_path / "real" / "epilog.d", "10-x", "#!/bin/sh\n")
    nested = HookSettings(phases={"prolog": "prolog.d", "epilog": "hooks/epilog.d"})
    assert problems(tmp_path, nested) == [
        "prolog.d: not a directory inside the repository",
        "hooks/epilog.d: not a directory inside the repository",
    ]


def test_a_bad_revision_is_refused_and_the_good_one_stays(tmp_path):
    good, bad, state = tmp_path / "good", tmp_path / "bad", tmp_path / "state"
    _script(good / "prolog.d", "10-ok", "#!/bin/sh\necho ok\n")
    _script(bad / "prolog.d", "10-ok", "#!/bin/bash\r\necho ok\r\n")
    assert consider(good, GOOD, SETTINGS, state)
    assert not consider(bad, BAD, SETTINGS, state)
    status = read_status(state)
    assert status["active"]["revision"] == GOOD
    assert status["refused"]["revision"] == BAD
    assert status["refused"]["reason"] == (
        "prolog.d/10-ok: #! line ends in a carriage return (CRLF line ends?)"
    )
    assert (state / "active" / "prolog" / "10-ok").read_text() == "#!/bin/sh\necho ok\n"
    assert [p.name for p in (state / "revisions").iterdir()] == [GOOD]  # no staging left
    good.rename(tmp_path / "gone")  # git-sync removes old worktrees: the store keeps a copy
    assert (state / "active" / "prolog" / "10-ok").exists()


def test_the_store_copy_is_roots_whatever_the_checkout_modes(tmp_path):
    tree, state = tmp_path / "tree", tmp_path / "state"
    _script(tree / "prolog.d", "10-open", "#!/bin/sh\n", 0o777)
    _script(tree / "prolog.d" / ".lib", "common.sh", "", 0o666)
    (tree / "prolog.d" / ".lib").chmod(0o777)
    (tree / "prolog.d" / ".common").symlink_to(".lib/common.sh")
    assert consider(tree, GOOD, SETTINGS, state)
    active = state / "active" / "prolog"
    assert stat.S_IMODE((active / "10-open").stat().st_mode) == 0o755
    assert stat.S_IMODE((active / ".lib").stat().st_mode) == 0o755
    assert stat.S_IMODE((active / ".lib" / "common.sh").stat().st_mode) == 0o644
    assert os.readlink(active / ".common") == ".lib/common.sh"


def test_the_prolog_and_epilog_copies_are_roots_alone(tmp_path):
    """Hooks may carry a site's secrets: what runs as root is root's alone; task scripts run
    as the job's user, who must read them."""
    tree, state = tmp_path / "tree", tmp_path / "state"
    settings = dataclasses.replace(
        SETTINGS, phases={**SETTINGS.phases, "task-prolog": "task-prolog.d"}
    )
    for folder in ("prolog.d", "epilog.d", "task-prolog.d"):
        _script(tree / folder, "10-x", "#!/bin/sh\n", 0o755)
    assert consider(tree, GOOD, settings, state)
    active = state / "active"
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in active.resolve().iterdir()}
    assert modes == {"prolog": 0o700, "epilog": 0o700, "task-prolog": 0o755}
    (active / "prolog").chmod(0o755)  # as an older slonk left it
    assert consider(tree, GOOD, settings, state)
    assert stat.S_IMODE((active / "prolog").stat().st_mode) == 0o700


def test_a_revision_too_large_on_disk_is_refused(tmp_path):
    """A large file anywhere in the repository, not only in the hook directories, costs every
    worker its size twice (objects and checkout): past 16 x maxFileBytes the revision is
    refused and the last good one stays; the next one without it passes."""
    good, big, state = tmp_path / "good", tmp_path / "big", tmp_path / "state"
    _script(good / "prolog.d", "10-ok", "#!/bin/sh\n")
    assert consider(good, GOOD, SETTINGS, state)
    _script(big / "prolog.d", "10-ok", "#!/bin/sh\n")
    (big / "data").mkdir()
    (big / "data" / "blob").write_bytes(b"x" * (16 * SETTINGS.max_file_bytes))
    assert not consider(big, BAD, SETTINGS, state)
    status = read_status(state)
    assert status["active"]["revision"] == GOOD
    assert status["refused"]["reason"] == (
        f"the checkout is larger than {16 * SETTINGS.max_file_bytes} bytes (16 x maxFileBytes; "
        "every worker keeps it twice): keep only hooks in the repository"
    )
    (big / "data" / "blob").unlink()
    assert consider(big, BAD, SETTINGS, state)


def test_many_problems_are_counted_not_all_listed(tmp_path):
    for i in range(30):
        _script(tmp_path / "tree" / "prolog.d", f"{i:02}", "no interpreter\n")
    assert not consider(tmp_path / "tree", BAD, SETTINGS, tmp_path / "state")
    reason = read_status(tmp_path / "state")["refused"]["reason"]
    assert reason.endswith("prolog.d/19: no #! line; and 10 more")


@pytest.mark.parametrize("target", ["/etc", "../../etc", f"../{'c' * 40}"])
def test_a_link_out_of_git_syncs_root_is_refused(tmp_path, target):
    root, state = tmp_path / "root", tmp_path / "state"
    root.mkdir()
    (root / "hooks").symlink_to(target)
    tree, revision = published(root, "hooks")
    assert revision == target
    assert not consider(tree, revision, SETTINGS, state)
    assert read_status(state)["refused"]["reason"] == (
        f"{target}: not a commit's worktree in git-sync's root"
    )


def test_a_revision_name_is_a_commit_id(tmp_path):
    _script(tmp_path / "tree" / "prolog.d", "10-ok", "#!/bin/sh\n")
    for name in ("..", ".", "main", "a" * 39, "A" * 40, "a" * 40 + "\n"):
        assert not consider(tmp_path / "tree", name, SETTINGS, tmp_path / "state")
    assert not (tmp_path / "state" / "active").exists()


def _run(tmp_path, monkeypatch, scripts, phase="prolog", job="42", settings=SETTINGS, nodes=()):
    """The dispatcher over these scripts, Slurm showing `nodes`: its exit code and the drain
    reasons it wrote."""
    state, logs, tree = tmp_path / "state", tmp_path / "logs", tmp_path / "tree"
    for name, text in scripts.items():
        _script(tree / f"{phase}.d", name, text)
    assert consider(tree, GOOD, settings, state)
    write_settings(settings, state)
    drained = []
    monkeypatch.setattr(slurm_nodes, "drain", lambda name, reason: drained.append(reason))
    monkeypatch.setattr(slurm_nodes, "read_nodes", lambda: list(nodes))
    monkeypatch.setenv("SLURM_JOB_ID", job)
    monkeypatch.setenv("SLURMD_NODENAME", "slonk-cpu-1")
    return dispatch.run(phase, state, logs), drained


def test_dispatcher_runs_in_order_logs_and_fails_on_the_first_error(tmp_path, monkeypatch):
    code, drained = _run(
        tmp_path,
        monkeypatch,
        {
            "10-first": "#!/bin/sh\necho first $SLURM_JOB_ID\n",
            "20-fails": "#!/bin/sh\necho oops >&2\nexit 3\n",
            "30-never": "#!/bin/sh\necho never\n",
        },
    )
    assert code == 1
    log = (tmp_path / "logs" / "42.log").read_text()
    assert "first 42" in log and "oops" in log and "never" not in log
    # A hook's drain, not health's; naming the revision, so a failure elsewhere is told apart.
    assert drained == [f"slonk:hook:prolog:20-fails: exit 3 (revision {GOOD[:12]})"]
    assert slurm_nodes.NodeState("n", "idle", frozenset({"DRAIN"}), drained[0]).cause.kind == "hook"
    assert dispatch.run("epilog", tmp_path / "state", tmp_path / "logs") == 0  # nothing to do


def test_every_epilog_clears_leftovers_first_and_says_so_in_the_jobs_log(tmp_path, monkeypatch):
    from slonk.health import leftovers

    seen = []
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setattr(leftovers, "after_job", lambda: seen.append("epilog") or "scratch: did")
    # No scripts, no checks: the Epilog still clears what the user left.
    assert dispatch.run("epilog", tmp_path / "state", tmp_path / "logs") == 0
    assert seen == ["epilog"]
    assert (tmp_path / "logs" / "42.log").read_text() == "== epilog scratch: did\n"
    assert dispatch.run("prolog", tmp_path / "state", tmp_path / "logs") == 0
    assert seen == ["epilog"]  # the Epilog's alone


def test_leftovers_that_cannot_be_cleared_never_fail_the_epilog(tmp_path, monkeypatch, capsys):
    from slonk.health import leftovers

    def broken() -> str:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "a user's file name")

    monkeypatch.setattr(leftovers, "after_job", broken)
    assert dispatch.run("epilog", tmp_path / "state", tmp_path / "logs") == 0
    assert "leftovers not cleared: UnicodeDecodeError" in capsys.readouterr().err


def test_hook_logs_are_roots_alone(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    (logs / "42.log").write_text("left readable by an older slonk\n")
    (logs / "42.log").chmod(0o644)
    code, _ = _run(tmp_path, monkeypatch, {"10-env": "#!/bin/sh\nenv\n"})
    assert code == 0
    assert stat.S_IMODE(logs.stat().st_mode) == 0o700
    assert stat.S_IMODE((logs / "42.log").stat().st_mode) == 0o600


@pytest.mark.parametrize("job", ["../../etc/x", "42\n", "", "-1"])
def test_a_strange_job_id_names_no_log_path(tmp_path, monkeypatch, job):
    code, _ = _run(tmp_path, monkeypatch, {"10-ok": "#!/bin/sh\necho ok\n"}, job=job)
    assert code == 0
    assert [p.name for p in (tmp_path / "logs").iterdir()] == ["no-job.log"]


def test_dispatcher_times_out_a_script(tmp_path, monkeypatch):
    code, drained = _run(tmp_path, monkeypatch, {"10-slow": "#!/bin/sh\nsleep 30\n"}, "epilog")
    assert code == 1
    assert drained == [f"slonk:hook:epilog:10-slow: timed out after 2 s (revision {GOOD[:12]})"]
    settings = json.loads((tmp_path / "state" / "settings.json").read_text())
    assert settings == {"timeoutSeconds": 2, "phaseTimeoutSeconds": 30}


def test_a_phase_of_slow_scripts_times_out_as_a_whole(tmp_path, monkeypatch):
    """Three scripts each within its own timeout, but not together: the phase fails when its
    time is out, naming the phase's timeout, and what the script started is killed too."""
    slow = "#!/bin/sh\nsleep 0.8\n"
    scripts = {
        "10-a": slow,
        "20-b": slow,
        "30-c": f"#!/bin/sh\nsleep 30 &\necho $! > {tmp_path}/pid\nwait\n",
    }
    settings = dataclasses.replace(SETTINGS, phase_timeout_seconds=2)
    started = time.monotonic()
    code, drained = _run(tmp_path, monkeypatch, scripts, settings=settings)
    assert code == 1
    assert time.monotonic() - started < 2 + 1.5
    assert drained == [
        f"slonk:hook:prolog:30-c: the prolog phase timed out after 2 s (revision {GOOD[:12]})"
    ]
    pid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 5  # SIGKILL lands at once, though not synchronously
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _alive(pid)


def _alive(pid):
    """Running, not gone nor a zombie waiting for its new parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return stat_file.read().rpartition(") ")[2][0] != "Z"
    except FileNotFoundError:
        return False


def _drained_node(name, reason):
    return slurm_nodes.NodeState(name, "idle", frozenset({"DRAIN"}), reason)


BROKEN = {"10-tool": "#!/bin/sh\nno-such-tool\n"}  # exit 127: what no image has


def test_a_script_that_drained_another_node_holds_the_job_and_spares_this_node(
    tmp_path, monkeypatch
):
    """The walk: the job requeued off the node the script drained lands here and fails the
    same way. This node stays in service (the prolog succeeds in Slurm's eyes), and the job
    is held with a comment saying why."""
    calls = []
    monkeypatch.setattr(slurm_nodes, "scontrol", lambda *args: calls.append(args) or "")
    first = f"slonk:hook:prolog:10-tool: exit 127 (revision {GOOD[:12]})"
    code, drained = _run(tmp_path, monkeypatch, BROKEN, nodes=[_drained_node("slonk-cpu-0", first)])
    assert (code, drained) == (0, [])
    assert calls[-1] == ("requeuehold", "42")
    assert calls[0][:2] == ("update", "jobid=42")
    assert "failed on slonk-cpu-1 (exit 127" in calls[0][2]
    assert "as on slonk-cpu-0 which it drained" in calls[0][2]
    log = (tmp_path / "logs" / "42.log").read_text()
    assert "not drained" in log and "job 42 held" in log


@pytest.mark.parametrize(
    "other",
    [
        f"slonk:hook:prolog:10-tool: exit 127 (revision {BAD[:12]})",  # another revision
        f"slonk:hook:prolog:10-other: exit 127 (revision {GOOD[:12]})",  # another script
        f"slonk:hook:epilog:10-tool: exit 127 (revision {GOOD[:12]})",  # another phase
        "slonk:hook:prolog:10-tool: exit 127",  # an older slonk's: no revision
    ],
)
def test_a_failure_of_its_own_drains_the_node(tmp_path, monkeypatch, other):
    code, drained = _run(tmp_path, monkeypatch, BROKEN, nodes=[_drained_node("slonk-cpu-0", other)])
    assert code == 1
    assert drained == [f"slonk:hook:prolog:10-tool: exit 127 (revision {GOOD[:12]})"]


def test_the_node_a_script_drained_is_not_counted_as_another(tmp_path, monkeypatch):
    same = f"slonk:hook:prolog:10-tool: exit 127 (revision {GOOD[:12]})"
    code, drained = _run(tmp_path, monkeypatch, BROKEN, nodes=[_drained_node("slonk-cpu-1", same)])
    assert code == 1 and drained == [same]


def test_when_slurm_cannot_say_the_node_drains(tmp_path, monkeypatch):
    def unreadable():
        raise slurm_nodes.SlurmError("scontrol timed out")

    code, drained = _run(tmp_path, monkeypatch, BROKEN)
    monkeypatch.setattr(slurm_nodes, "read_nodes", unreadable)
    assert code == 1 and len(drained) == 1
    assert dispatch.drained_elsewhere("prolog", "10-tool", GOOD) is None


def test_a_job_slurm_cannot_requeue_is_cancelled(tmp_path, monkeypatch):
    def scontrol(*args):
        if args[0] == "requeuehold":
            raise slurm_nodes.SlurmError("Requested operation is presently disabled")
        return ""

    cancelled = []
    monkeypatch.setattr(slurm_nodes, "scontrol", scontrol)
    monkeypatch.setattr(slurm_nodes, "run", lambda argv, **_: cancelled.append(argv) or "")
    assert dispatch.hold_job("42", "why") == "job 42 cancelled"
    assert cancelled == [["scancel", "42"]]
    assert dispatch.hold_job("42;x", "why") == "no job to hold"


def test_an_epilog_that_drained_another_node_spares_this_one(tmp_path, monkeypatch):
    first = f"slonk:hook:epilog:10-tool: exit 127 (revision {GOOD[:12]})"
    monkeypatch.setattr(slurm_nodes, "scontrol", lambda *args: pytest.fail("no job to hold"))
    code, drained = _run(
        tmp_path, monkeypatch, BROKEN, "epilog", nodes=[_drained_node("slonk-cpu-0", first)]
    )
    assert (code, drained) == (0, [])


def _commit(repo, name, text):
    (repo / name).write_text(text)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            name,
        ],
        check=True,
    )
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def test_local_git_sync_keeps_git_syncs_contract(tmp_path):
    repo, root = tmp_path / "repo", tmp_path / "root"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    first = _commit(repo, "a", "1")
    assert sync_once(f"file://{repo}", "HEAD", root, "hooks", 1) == first
    assert os.readlink(root / "hooks") == f".worktrees/{first}"
    assert sync_once(f"file://{repo}", "HEAD", root, "hooks", 1) is None
    second = _commit(repo, "b", "2")
    assert sync_once(f"file://{repo}", "HEAD", root, "hooks", 1) == second
    assert (root / "hooks" / "b").read_text() == "2"
    assert not (root / ".worktrees" / first).exists()
    assert sync_once(str(repo), first, root, "hooks", 0) == first  # a path, a commit, no depth


def test_local_git_sync_keeps_its_tree_from_every_other_user(tmp_path):
    """Jobs run as their users in the pod that mounts git-sync's root: nothing under it may
    be theirs to read, whatever modes the pusher gave the files or an older stand-in left."""
    repo, root = tmp_path / "repo", tmp_path / "root"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    _commit(repo, "prolog", "#!/bin/sh\n")
    sync_once(f"file://{repo}", "HEAD", root, "hooks", 1)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            assert not path.lstat().st_mode & 0o077, path


def test_local_git_sync_keeps_only_the_current_revisions_objects(tmp_path):
    repo, root = tmp_path / "repo", tmp_path / "root"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    _commit(repo, "blob", os.urandom(1 << 20).hex())
    sync_once(f"file://{repo}", "HEAD", root, "hooks", 1)
    (repo / "blob").unlink()
    _commit(repo, "prolog", "#!/bin/sh\n")
    sync_once(f"file://{repo}", "HEAD", root, "hooks", 1)
    assert sum(p.stat().st_size for p in (root / ".git").rglob("*") if p.is_file()) < 1 << 18


@pytest.mark.parametrize(
    ("repo", "ref", "link", "refused"),
    [
        ("ext::sh -c touch% {pwned}", "HEAD", "hooks", "GITSYNC_REPO"),
        ("ext::sh -c 'touch {pwned}'", "HEAD", "hooks", "GITSYNC_REPO"),
        ("fd::3", "HEAD", "hooks", "GITSYNC_REPO"),
        ("--upload-pack=touch {pwned}", "HEAD", "hooks", "GITSYNC_REPO"),
        ("-u", "HEAD", "hooks", "GITSYNC_REPO"),
        ("ssh://-oProxyCommand=touch%20{pwned}/x", "HEAD", "hooks", "GITSYNC_REPO"),
        ("-oProxyCommand=x:repo", "HEAD", "hooks", "GITSYNC_REPO"),
        ("gopher://example.org/repo", "HEAD", "hooks", "GITSYNC_REPO"),
        ("file://{repo}\n", "HEAD", "hooks", "GITSYNC_REPO"),
        ("relative/path", "HEAD", "hooks", "GITSYNC_REPO"),
        ("file://{repo}", "--upload-pack=touch {pwned}", "hooks", "GITSYNC_REF"),
        ("file://{repo}", "-h", "hooks", "GITSYNC_REF"),
        ("file://{repo}", "main:refs/heads/x", "hooks", "GITSYNC_REF"),
        ("file://{repo}", "+main", "hooks", "GITSYNC_REF"),
        ("file://{repo}", "main..x", "hooks", "GITSYNC_REF"),
        ("file://{repo}", "HEAD\n", "hooks", "GITSYNC_REF"),
        ("file://{repo}", "HEAD", "../../etc", "GITSYNC_LINK"),
        ("file://{repo}", "HEAD", "-x", "GITSYNC_LINK"),
    ],
)
def test_local_git_sync_refuses_what_git_would_read_as_an_option_or_a_command(
    tmp_path, repo, ref, link, refused
):
    source, pwned = tmp_path / "repo", tmp_path / "pwned"
    subprocess.run(["git", "init", "-q", str(source)], check=True)
    _commit(source, "a", "1")
    with pytest.raises(gitsync.Refused, match=refused):
        sync_once(
            repo.format(repo=source, pwned=pwned),
            ref.format(pwned=pwned),
            tmp_path / "root",
            link,
            1,
        )
    assert not pwned.exists()


def test_git_itself_refuses_other_transports(tmp_path, monkeypatch):
    """Behind the checks, git's own allow-list (a redirect, a check missed)."""
    monkeypatch.setattr(gitsync, "check_repo", lambda repo: repo)
    with pytest.raises(subprocess.CalledProcessError) as failed:
        sync_once(f"ext::sh -c touch% {tmp_path}/pwned", "HEAD", tmp_path / "root", "hooks", 1)
    assert "transport 'ext' not allowed" in failed.value.stderr
    assert not (tmp_path / "pwned").exists()
