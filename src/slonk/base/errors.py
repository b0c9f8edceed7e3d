"""The base of every error slonk reports to a person: its message says what to fix.

`slonk` prints such an error as one line and exits 1, never with a traceback; anything else
escaping a command is a bug and keeps its traceback. Each error class lives beside the code
that raises it; this module is imported by all of them, so it imports nothing.
"""

from __future__ import annotations


class SlonkError(Exception):
    """A user-facing error (bad input, a missing Secret, a daemon that said no)."""
