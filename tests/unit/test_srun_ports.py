"""No user holds more than a share of srun's ports on a pod: tried from the user's side (one
process binding the whole range, in every way a socket can hold a port: bound and nothing
more, listening, IPv6), beside a user within their share and root's own sockets."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from slonk.pod import srun_ports

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sockets of other users need root")

ATTACKER, NEIGHBOUR = 5481, 5482  # in no passwd: binding and ending need only the id
PYTHON = "/usr/bin/python3"  # the users reach it; the tests' own interpreter may be root's alone

# Binds argv[1] ports from argv[2] on, a third each bound only, listening, and IPv6; says so.
HOLD = """
import socket, sys, time
count, first = int(sys.argv[1]), int(sys.argv[2])
held = []
for i in range(count):
    s = socket.socket(socket.AF_INET6 if i % 3 == 2 else socket.AF_INET)
    s.bind(("::" if i % 3 == 2 else "0.0.0.0", first + i))
    if i % 3 == 1:
        s.listen()
    held.append(s)
print(len(held), flush=True)
time.sleep(600)
"""

# A pod of its own: a network namespace (its ports are no one else's) and a PID namespace
# whose PID 1 reaps as s6-svscan does, so kill(-1) as a user reaches only what runs here.
POD = """
import os, signal, socket, subprocess, sys
from slonk.pod import srun_ports

signal.signal(signal.SIGCHLD, signal.SIG_IGN)
python, hold, attacker, neighbour = sys.argv[1:5]

def holder(count, start, uid=None):
    who = dict(user=int(uid), group=int(uid)) if uid else {}
    p = subprocess.Popen([python, "-c", hold, str(count), str(start)], stdout=subprocess.PIPE,
                         text=True, **who)
    assert p.stdout.readline().strip() == str(count)
    return p

attack = holder(20, 40000, attacker)  # of 40000-40029, whose share is 3
print(srun_ports.look(40000, 40029))  # alone on the pod: they keep no one else out
fair = holder(3, 40020, neighbour)  # their share, no more
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
# Connections to the neighbour's listening port (as slurmstepds reach an srun) share its port.
calls = [socket.create_connection(("127.0.0.1", 40021)) for _ in range(5)]
roots = holder(7, 40023)  # the pod's own
print(srun_ports.running_short(40000, 40029))  # every port taken
print(sorted((uid, len(i)) for uid, i in srun_ports.holders(40000, 40029).items()))
print(*srun_ports.look(40000, 40029), sep="\\n")
print(*(os.path.exists(f"/proc/{p.pid}") for p in (attack, fair, roots)))
print(sorted((uid, len(i)) for uid, i in srun_ports.holders(40000, 40029).items()))
print(srun_ports.running_short(40000, 40029))  # 10 of 30 taken: never 12 of a sample of 16
"""


def _pod(*args: str) -> list[str]:
    ran = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc", sys.executable, "-c", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.splitlines()


def test_one_user_holding_the_range_loses_their_processes_and_no_one_else_does():
    alone, short, seen, ended, statuses, after, short_after = _pod(
        POD, PYTHON, HOLD, str(ATTACKER), str(NEIGHBOUR)
    )
    assert alone == "[]"
    assert (short, short_after) == ("True", "False")
    # Bound only, listening, IPv6: all seen, and whose; ports, not connections; root's never.
    assert seen == f"[({ATTACKER}, 20), ({NEIGHBOUR}, 3)]"
    assert ended == (
        f"uid {ATTACKER} held 20 of srun's ports 40000-40029 (a user's share: 3): "
        "ended its 1 processes on the pod"
    )
    assert statuses == "False True True"  # the holder gone; the neighbour's and root's run on
    assert after == f"[({NEIGHBOUR}, 3)]"


def test_a_share_is_a_tenth_of_the_range_and_never_less_than_one_srun():
    assert srun_ports.share(60001, 63000) == 300
    assert srun_ports.share(40000, 40009) == 3


def test_a_range_short_with_no_one_to_blame_is_said_once(monkeypatch, capsys):
    class Rounds(threading.Event):  # five looks, then stop
        left = 5

        def wait(self, timeout=None):
            self.left -= 1
            return self.left < 0

    shortness = iter([True, True, False, True, True])
    monkeypatch.setattr(srun_ports, "sees_bound_only", lambda: True)
    monkeypatch.setattr(srun_ports, "running_short", lambda first, last: next(shortness))
    monkeypatch.setattr(srun_ports, "look", lambda first, last: [])
    srun_ports.run_forever((60001, 63000), Rounds())
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2 and all("run short and no user over a share" in s for s in said)
