"""Users' homes on the shared /home: the root of it closed to users, each home made for its user.

Users can write /home's contents, and Kubernetes provisioners often hand out a volume whose
root is 0777: anyone could then make /home/bob before bob exists (a .bashrc of their own
choosing) or swap a home for a symbolic link between slonk's mkdir and its chown. So the
root is made root's and not group- or other-writable, and a home is made, opened without
following links and given away through that descriptor; one that already exists is never
given to anyone (it may be someone else's tree), only reported when it is not its user's.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from slonk.config import accounts
from slonk.config.spec import User

HOME_MODE = 0o700
# The root's mode bits kept: write for group and other, and set-id and sticky bits, go.
ROOT_BITS = 0o755


def _roots_alone(info: os.stat_result) -> bool:
    """Owned by root and writable by root alone (no set-id or sticky bit either)."""
    return info.st_uid == 0 and stat.S_IMODE(info.st_mode) & ~ROOT_BITS == 0


def secure_root(home: Path = Path(accounts.HOME), shown: str = accounts.HOME) -> list[str]:
    """Make the shared /home (mounted at `home`; or /scratch, `shown` as it is in the pods)
    root's, writable by root alone. Where the volume refuses (NFS with root_squash), one
    problem is returned: the pod still starts."""
    try:
        fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        return [f"{shown}: {err.strerror}"]
    try:
        info = os.fstat(fd)
        mode = stat.S_IMODE(info.st_mode)
        if _roots_alone(info):
            return []
        try:
            if info.st_uid != 0:
                os.fchown(fd, 0, -1)
            os.fchmod(fd, mode & ROOT_BITS)
        except OSError as err:
            return [
                f"{shown} is uid {info.st_uid}'s with mode {mode:o} and cannot be made "
                f"root's {mode & ROOT_BITS:o} ({err.strerror}): users may make or replace "
                "each other's directories there; fix its owner and mode on the volume"
            ]
        return []
    finally:
        os.close(fd)


def make_homes(users: Iterable[User], home: Path = Path(accounts.HOME)) -> list[str]:
    """Make each missing <HOME>/<name> on the shared /home (mounted at `home`; homes
    elsewhere are the directory's business), its user's with mode 0700. Returns one
    problem per home it could not make or that is not its user's; it changes no home
    that was already there."""
    mine = [u for u in users if u.home_dir == f"{accounts.HOME}/{u.name}"]
    return make_user_dirs(mine, home, accounts.HOME, "home")


def make_scratch(users: Iterable[User], scratch: Path = Path(accounts.SCRATCH)) -> list[str]:
    """Each user's <SCRATCH>/<name> on the site's scratch volume (values scratch), made as a
    home is: the user's, mode 0700; one already there is never given to anyone."""
    return make_user_dirs(list(users), scratch, accounts.SCRATCH, "scratch")


def make_user_dirs(users: list[User], root_path: Path, shown: str, what: str) -> list[str]:
    """<root>/<name> for each user, made and given away through descriptors (no link
    followed); one problem per directory not made or not its user's."""
    if not users:
        return []
    try:
        root = os.open(root_path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        return [f"cannot make {what} directories in {shown}: {err.strerror}"]
    try:
        return [p for user in users if (p := _make_dir(root, user, f"{shown}/{user.name}", what))]
    finally:
        os.close(root)


def _make_dir(root: int, user: User, where: str, what: str) -> str | None:
    try:
        os.mkdir(user.name, HOME_MODE, dir_fd=root)
        made = True
    except FileExistsError:
        made = False  # made earlier, by another pod sharing /home, or by someone else
    except OSError as err:
        return f"cannot make {where}: {err.strerror}"
    try:
        fd = os.open(user.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root)
    except OSError as err:
        return f"{what} {where} {_what(root, user.name, err)}: left alone"
    try:
        info = os.fstat(fd)
        if made and info.st_uid == os.geteuid():  # still the directory made above
            try:
                os.fchmod(fd, HOME_MODE)
                os.fchown(fd, user.uid, user.gid)
            except OSError as err:
                return f"cannot give {where} to {user.name}: {err.strerror}"
            return None
        if info.st_uid != user.uid:
            return (
                f"{what} {where} is uid {info.st_uid}'s, not {user.name}'s (uid {user.uid}): "
                "left alone; check who made it and what it holds"
            )
        return None
    finally:
        os.close(fd)


def shared_dir(name: str, home: Path = Path(accounts.HOME)) -> str | None:
    """Make <HOME>/<name> (mounted at `home`) root's with mode 0755 for every pod to read,
    as a home is made: through descriptors, no link followed. It is used only if it and
    /home are root's and writable by root alone; otherwise the problem is returned and the
    caller offers nothing from it (a user may have made it while /home was open to all)."""
    where = f"{accounts.HOME}/{name}"
    try:
        root = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        return f"cannot open {accounts.HOME}: {err.strerror}"
    try:
        # A /home users can write (a root_squash export slonk could not close) lets any user
        # rename the checked directory away and put their own in its place after this look.
        info = os.fstat(root)
        if not _roots_alone(info):
            mode = stat.S_IMODE(info.st_mode)
            return (
                f"{accounts.HOME} is uid {info.st_uid}'s with mode {mode:o}, not root's alone: "
                f"users could replace {where}; not used"
            )
        try:
            os.mkdir(name, ROOT_BITS, dir_fd=root)
        except FileExistsError:
            pass
        except OSError as err:  # NFS with root_squash: not made, nothing offered
            return f"cannot make {where}: {err.strerror}"
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root)
        except OSError as err:
            return f"{where} {_what(root, name, err)}: not used"
        try:
            info = os.fstat(fd)
            if not _roots_alone(info):
                return (
                    f"{where} is uid {info.st_uid}'s with mode {stat.S_IMODE(info.st_mode):o}, "
                    "not root's alone: not used; check who made it and what it holds"
                )
            return None
        finally:
            os.close(fd)
    finally:
        os.close(root)


def _what(root: int, name: str, err: OSError) -> str:
    """Why a home could not be opened as a directory, without following a link."""
    if err.errno not in (errno.ELOOP, errno.ENOTDIR):
        return f"cannot be opened: {err.strerror}"
    try:
        link = stat.S_ISLNK(os.lstat(name, dir_fd=root).st_mode)
    except OSError:
        link = False
    return "is a symbolic link" if link else "is not a directory"
