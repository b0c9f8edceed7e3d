"""slurmctld under s6, as config-watch drives it: is it answering, have it run new files,
and when it will not run them, what it said.

New files are applied by `scontrol reconfigure` where Slurm 24.11 allows it, measured on
24.11.5 with slurmctld in the foreground (-D, as s6 runs it): the reconfigure saves the
state and re-executes slurmctld in place (same pid), which re-reads every file: nodes,
NodeSets, partitions, topology and even a select plugin change; jobs keep running, and the
new process sends the files to every slurmd (each says "Caught SIGHUP. Triggering
reconfigure"). scontrol answers before the re-execution: a new process that will not run
the files dies (`fatal: Can't find plugin for select/bogus`, exit 1) without serving them,
so slurmctld is started once on them (`s6-svc -o`) and is not started again before
config-watch has put the previous files back. scontrol reads the new files itself first: a
file it cannot parse is refused by scontrol, and slurmctld keeps running the previous files.
(Without -D, slurmctld forks the new process and the old one keeps serving when it fails —
"slurm_reconfigure error: Unspecified error" — but s6 cannot supervise a daemon that
replaces its own pid.)

Still applied by a restart (RESTART_KEYS): SlurmctldPort and AuthType (scontrol, reading
the new files, cannot reach or authenticate to the running slurmctld), SlurmctldHost (a
re-executed slurmctld on another host name dies: "This host ... not a valid controller")
and SlurmUser (the re-executed slurmctld aborts starting slurmscriptd). A stop saves the
state; a start either runs the files or dies saying why, before serving them to anyone;
the files are then sent to the slurmds by a reconfigure.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from slonk.base import paths
from slonk.base.identity import pod_name
from slonk.base.text import printable

# Starting slurmctld recovers its state and resolves every node: generous, but bounded.
START_TIMEOUT_SECONDS = 180.0
COMMAND_TIMEOUT_SECONDS = 60.0
POLL_SECONDS = 0.2


# Global slurm.conf settings a reconfigure cannot change (measured on 24.11, see above).
RESTART_KEYS = frozenset({"slurmctldport", "authtype", "slurmctldhost", "slurmuser"})
# The first line a (re-)executed slurmctld logs: it has read its files.
STARTED = " started on cluster "


def _global_settings(slurm_conf: str) -> dict[str, str]:
    settings: dict[str, str] = {}
    for line in slurm_conf.splitlines():
        key, eq, value = line.strip().partition("=")
        if eq and not key.startswith("#"):
            settings.setdefault(key.lower(), value)
    return settings


def needs_restart(old_conf: str, new_conf: str) -> list[str]:
    """The settings between two slurm.conf texts that only a restart applies."""
    old, new = _global_settings(old_conf), _global_settings(new_conf)
    return sorted(k for k in RESTART_KEYS if old.get(k) != new.get(k))


class Refused(RuntimeError):
    """slurmctld would not run the new files; the message is what it said."""


def _run(*command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A Slurm or s6 command; one that hangs counts as failed (it never raises)."""
    try:
        return subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_SECONDS,
            check=False,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, -1, "", f"{command[0]}: timed out")


def _printable(line: str, limit: int = 500) -> str:
    """slurmctld's words go into slonk's one log line and its record: no control characters
    (a `\r` or an escape sequence would rewrite what a terminal shows), bounded."""
    return printable(line[:limit])


def _what_it_said(lines: list[str]) -> str:
    """Its last fatal line, with the error line just before it (a parse error names the
    key there); else its last error line."""
    said = [_printable(line.removeprefix("slurmctld: ").strip()) for line in lines]
    fatal = [i for i, line in enumerate(said) if line.startswith("fatal:")]
    if fatal:
        last = fatal[-1]
        before = said[last - 1] if last and said[last - 1].startswith("error:") else None
        return "; ".join(line for line in (before, said[last]) if line)
    errors = [line for line in said if line.startswith("error:")]
    return errors[-1] if errors else ""


@dataclass(frozen=True)
class Slurmctld:
    service: Path = paths.SCAN_DIR / "slurmctld"
    log: Path = paths.SLURMCTLD_LOG
    conf: Path = paths.SLURMCTLD_CONF_DIR / "slurm.conf"
    start_timeout: float = START_TIMEOUT_SECONDS

    def _scontrol(self, *args: str) -> subprocess.CompletedProcess[str]:
        """scontrol on slurmctld's own files: a configless client would first fetch them from
        slurmctld, and takes 9 s to give up when it is down (measured on 22.05)."""
        return _run("scontrol", *args, env={**os.environ, "SLURM_CONF": str(self.conf)})

    def _svc(self, *flags: str) -> None:
        subprocess.run(
            ["s6-svc", *flags, str(self.service)],
            check=True,
            capture_output=True,
            timeout=self.start_timeout + 10,
        )

    def _pid(self) -> int | None:
        """The running daemon's pid, None while it is down."""
        out = _run("s6-svstat", "-o", "up,pid", str(self.service)).stdout.split()
        return int(out[1]) if out[:1] == ["true"] and len(out) == 2 else None

    def answers(self) -> bool:
        """This pod's own slurmctld answers (in control or, with a backup, in standby): its
        line of `scontrol ping`, which lists every controller."""
        result = self._scontrol("ping")
        mine = f" at {pod_name()} is UP"
        return result.returncode == 0 and any(
            line.endswith(mine) for line in result.stdout.splitlines()
        )

    def version(self) -> str:
        return _run("slurmctld", "-V").stdout.strip()

    def mark(self) -> int:
        """Where its log is now: what it says from here on is read by `said`."""
        try:
            return self.log.stat().st_size
        except OSError:
            return 0

    def _lines(self, mark: int) -> list[str]:
        try:
            with open(self.log, "rb") as log:
                if log.seek(0, 2) < mark:
                    mark = 0  # s6-log rotated it
                log.seek(mark)
                return log.read().decode(errors="replace").splitlines()
        except OSError:
            return []

    def said(self, mark: int) -> str:
        return _what_it_said(self._lines(mark))

    def keep_up(self) -> None:
        """s6 restarts it again when it dies (undoes `-o`)."""
        self._svc("-u")

    def _timeout(self) -> list[str]:
        return ["-T", str(int(self.start_timeout * 1000))]

    def _stop(self) -> None:
        """A stop: slurmctld saves its state and exits; s6 leaves it down."""
        self._svc("-wD", *self._timeout(), "-d")

    def _wait(self, pid: int | None) -> bool:
        """Until daemon `pid` answers (True), or is gone or the bound passed (False)."""
        deadline = time.monotonic() + self.start_timeout
        while pid is not None and time.monotonic() < deadline:
            if self._pid() != pid:
                return False
            if self.answers():
                return True
            time.sleep(POLL_SECONDS)
        return False

    def restart(self) -> None:
        """Stop it, start it once on the new files, and wait until it answers; raises
        Refused (it is left down) if it dies or does not answer within the bound."""
        mark = self.mark()
        self._stop()
        self._svc("-wu", *self._timeout(), "-o")
        if self._wait(self._pid()):
            self.keep_up()
            return
        self._give_up(mark)

    def _give_up(self, mark: int) -> NoReturn:
        """Stop it, and raise Refused with why: hung past the bound, or what it said as it
        died (its log from `mark`)."""
        hung = self._pid() is not None
        self._stop()
        if hung:
            raise Refused(f"it did not answer within {self.start_timeout:g} s")
        raise Refused(self.said(mark) or "it exited")

    def reconfigure(self) -> str:
        """Have it run the new files by `scontrol reconfigure` and wait until the
        re-executed slurmctld answers; returns what to say. Raises Refused: if scontrol
        refused the files, slurmctld still runs the previous ones; if the new process died
        or did not answer within the bound, it is left down."""
        mark, pid = self.mark(), self._pid()
        self._svc("-o")
        result = self._scontrol("reconfigure")
        if result.returncode != 0:
            self.keep_up()
            said = _what_it_said(
                [
                    line.removeprefix("scontrol: ")
                    for line in (result.stderr or result.stdout).splitlines()
                ]
            )
            raise Refused(said or "scontrol reconfigure failed")
        deadline = time.monotonic() + self.start_timeout
        while pid is not None and time.monotonic() < deadline:
            if self._pid() != pid:
                break  # the new process died
            if any(STARTED in line for line in self._lines(mark)) and self.answers():
                self.keep_up()
                return "sent it to the slurmds"
            time.sleep(POLL_SECONDS)
        self._give_up(mark)

    def started(self) -> None:
        """The daemon s6 started with the pod: wait until it answers; raises Refused (it is
        left down) if it dies or does not answer within the bound."""
        deadline, first = time.monotonic() + self.start_timeout, None
        while time.monotonic() < deadline:
            pid = self._pid()
            first = first or pid
            if first is not None and pid != first:  # it died (s6 may have started another)
                self._stop()
                raise Refused(self.said(0) or "it exited")
            if pid is not None and self.answers():
                return
            time.sleep(POLL_SECONDS)
        self._stop()
        raise Refused(f"it did not answer within {self.start_timeout:g} s")

    def recover(self) -> bool:
        """After the previous files are back: start it on them; True once it answers."""
        self._stop()
        self._svc("-wu", *self._timeout(), "-u")
        return self._wait(self._pid())

    def push(self) -> str:
        """Send what it runs to every slurmd (configless: slurmd caches what slurmctld sends)."""
        result = self._scontrol("reconfigure")
        if result.returncode == 0:
            return "sent it to the slurmds"
        said = (result.stderr or result.stdout).strip()
        return f"sending it to the slurmds, scontrol reconfigure said: {said}"
