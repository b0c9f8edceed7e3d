"""An untrusted hook tree, walked and copied: every entry of a phase's directory (helpers
included), each opened from its parent directory's descriptor without following a symlink,
and copied only if it is the very file or directory the walk saw.

The repository is untrusted input, and so is git-sync's volume: whatever can write there may
swap an entry at any moment. What an entry may be:
- names: printable ASCII (they reach Slurm's drain reasons, logs and the status, where a
  U+2028 or a NEL ends a line), not starting with `-` or `+` (a program's options);
- kinds: regular files with one link, directories, and symlinks resolving inside the phase's
  directory to a file or directory; no FIFO, socket or device, no setuid or setgid bit;
- sizes: each file within maxFileBytes, the directory within TREE_BYTES_PER_FILE of them,
  MAX_ENTRIES entries, MAX_DEPTH levels.
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from slonk.config.spec import HookSettings

# A phase's scripts and their helpers are a handful of small files; these bound what a
# repository can make every node copy and check.
MAX_ENTRIES = 1000
MAX_DEPTH = 8
TREE_BYTES_PER_FILE = 8  # a phase directory holds at most 8 x maxFileBytes in all
# What a name (or a symlink's target) in a hook tree may hold.
PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]+")


class Refused(Exception):
    """Why an entry or a script may not run."""


def shown(text: str) -> str:
    """`text` as it may be printed: control characters and undecodable bytes escaped."""
    out = []
    for char in text:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char.isprintable():
            out.append(char)
        else:
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return "".join(out)


def _check_text(text: str, what: str) -> None:
    """Names reach Slurm's drain reasons, the log and the status: each must stay one line
    wherever it goes (Python's splitlines() ends lines at U+2028, NEL, FS, VT...)."""
    if not PRINTABLE_ASCII.fullmatch(text):
        raise Refused(f"{what} is not printable ASCII")


@dataclass(frozen=True)
class Entry:
    relative: str  # inside the phase directory
    kind: str  # "dir", "file" or "link"
    mode: int
    target: str = ""  # a link's
    identity: tuple[int, int] = (0, 0)  # (st_dev, st_ino) as walked: what the copy takes


def open_dir(name: str | Path, dir_fd: int | None = None) -> int:
    """A directory, never through a symlink. O_NOFOLLOW guards the last component only: a
    path inside an untrusted tree is opened one component at a time, from its parent."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(name, flags, dir_fd=dir_fd)


def _identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


def _link_target(dir_fd: int, name: str, root: str) -> str:
    """A symlink's target, if it stays inside the phase directory `root` (real path)."""
    target = os.readlink(name, dir_fd=dir_fd)
    _check_text(target, "symlink target")
    real = os.path.realpath(f"/proc/self/fd/{dir_fd}/{name}")
    if os.path.isabs(target) or (real != root and not real.startswith(root + os.sep)):
        raise Refused(f"symlink to {shown(target)} points outside its directory")
    try:
        mode = os.stat(real).st_mode
    except OSError:
        raise Refused(f"symlink to {shown(target)} points to nothing") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise Refused(f"symlink to {shown(target)} points to a special file")
    return target


def walk(folder: int, shown_as: str, settings: HookSettings) -> tuple[list[Entry], list[str]]:
    """Every entry under a phase directory (an open descriptor), depth first, never
    following a symlink, and what is wrong with them. Stops at the first limit a tree
    exceeds: a huge tree is not read to its end."""
    entries: list[Entry] = []
    found: list[str] = []
    root = os.path.realpath(f"/proc/self/fd/{folder}")
    budget = settings.max_file_bytes * TREE_BYTES_PER_FILE
    total = seen = 0

    def scan(fd: int, relative: str, depth: int) -> str | None:
        """The directory's entries; a limit exceeded, if one was."""
        nonlocal total, seen
        with os.scandir(fd) as listing:
            children = sorted(
                itertools.islice(listing, MAX_ENTRIES - seen + 1), key=lambda e: e.name
            )
        seen += len(children)
        if seen > MAX_ENTRIES:
            return f"more than {MAX_ENTRIES} entries"
        for child in children:
            name = os.path.join(relative, child.name)
            try:
                _check_text(child.name, "name")
                if child.name[0] in "-+":
                    raise Refused(f"name starts with '{child.name[0]}'")
                info = child.stat(follow_symlinks=False)
                if info.st_mode & (stat.S_ISUID | stat.S_ISGID):
                    raise Refused("setuid or setgid bit")
                if stat.S_ISLNK(info.st_mode):
                    entries.append(Entry(name, "link", 0, _link_target(fd, child.name, root)))
                elif stat.S_ISDIR(info.st_mode):
                    if depth >= MAX_DEPTH:
                        raise Refused(f"directories nested deeper than {MAX_DEPTH}")
                    entries.append(Entry(name, "dir", info.st_mode, identity=_identity(info)))
                    inner = open_dir(child.name, fd)
                    try:
                        if _identity(os.fstat(inner)) != _identity(info):
                            raise Refused("changed while it was walked")
                        exceeded = scan(inner, name, depth + 1)
                    finally:
                        os.close(inner)
                    if exceeded:
                        return exceeded
                elif stat.S_ISREG(info.st_mode):
                    if info.st_size > settings.max_file_bytes:
                        raise Refused(f"larger than {settings.max_file_bytes} bytes")
                    if info.st_nlink > 1:  # git checks out files, never links them
                        raise Refused("a hard link")
                    total += info.st_size
                    entries.append(Entry(name, "file", info.st_mode, identity=_identity(info)))
                else:
                    raise Refused("not a regular file, directory or symlink")
            except Refused as err:
                found.append(f"{shown_as}/{shown(name)}: {err}")
        if total > budget:
            return f"more than {budget} bytes in all"
        return None

    exceeded = scan(folder, "", 0)
    return entries, [*found, f"{shown_as}: {exceeded}"] if exceeded else found


def open_phase(tree: int, directory: str) -> int | None:
    """The phase's directory in the tree, opened component by component: None when the
    repository has none; refused when it is not a real directory there (a symlink on the
    way could lead anywhere)."""
    fd = os.dup(tree)
    try:
        for part in directory.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                raise Refused("not a directory inside the repository")
            try:
                inner = open_dir(part, fd)
            except FileNotFoundError:
                return None
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):  # a symlink, a file
                    raise Refused("not a directory inside the repository") from None
                raise Refused(f"cannot be opened ({err.strerror})") from None
            os.close(fd)
            fd = inner
        opened, fd = fd, -1
        return opened
    finally:
        if fd >= 0:
            os.close(fd)


def copy_entries(
    folder: int, entries: list[Entry], target: Path, max_bytes: int, mode: int = 0o755
) -> None:
    """The walked entries into slonk's store: root's, with modes of its own. Each is opened
    from its parent's descriptor without following a symlink, and copied only if it is what
    the walk saw (st_dev, st_ino): a directory swapped for a symlink to a root-only one since
    the walk cannot lead the copy out of the tree. A file grown past `max_bytes` since the
    walk is copied one byte over, so the copy's check refuses it. `target` gets `mode`."""
    target.mkdir(mode=mode)
    os.chmod(target, mode)  # whatever the umask
    opened = [("", folder)]  # the directories down to the current entry; walk is depth first
    try:
        for entry in entries:
            parent, _, name = entry.relative.rpartition("/")
            while len(opened) > 1 and opened[-1][0] != parent:
                os.close(opened.pop()[1])
            if opened[-1][0] != parent:
                raise Refused(f"{shown(entry.relative)}: not after its directory")
            copy = target / entry.relative
            if entry.kind == "link":
                copy.symlink_to(entry.target)
                continue
            # Not waiting on a FIFO swapped in: O_NONBLOCK; it is then refused as not the same.
            kind = os.O_DIRECTORY if entry.kind == "dir" else os.O_NONBLOCK
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | kind
            fd = os.open(name, flags, dir_fd=opened[-1][1])
            info = os.fstat(fd)
            if _identity(info) != entry.identity or (
                entry.kind == "file" and (not stat.S_ISREG(info.st_mode) or info.st_nlink > 1)
            ):
                os.close(fd)
                raise Refused(f"{shown(entry.relative)} changed while it was copied")
            if entry.kind == "dir":
                opened.append((entry.relative, fd))
                copy.mkdir(mode=0o755)
                continue
            with os.fdopen(fd, "rb") as data:
                mode = 0o755 if entry.mode & 0o111 else 0o644
                out_fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
                with os.fdopen(out_fd, "wb") as out:
                    out.write(data.read(max_bytes + 1))
    finally:
        for _, fd in opened[1:]:
            os.close(fd)
