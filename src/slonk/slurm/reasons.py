"""The one home of slonk's Slurm drain reasons: how each kind is written, and what a reason
read back from Slurm is.

Every reason slonk writes starts `slonk:`; the word after it says who drained the node:

  slonk:<check>: <detail>                 a health check: the machine is at fault (HEALTH)
  slonk:active:<check>: <detail>          an active check (a test run as a Slurm job, or at
                                          boot before service) failed: HEALTH, named
                                          `active:<check>`
  slonk:trend:<rule>: <detail>            a GPU counter rose too fast: HEALTH, named
                                          `trend:<rule>`, never lifted by a pass nor recycled
  slonk:hook:<phase>:<script>: <detail>   a job hook from git failed: the script is (HOOK)
  slonk:quarantine: <detail>              recycled too often; left for a person (QUARANTINE)
  slonk:pod: <detail>                     the pod is stopping (POD; slonk.pod.worker_stop's
                                          preStop drain, handed over as DOWN at SIGTERM)
  slonk:scale-down: <detail>              local mode's upgrade removes the pod (SCALE_DOWN)
  slonk:k8s:<cause>: <detail>             Kubernetes says the machine or pod cannot take jobs:
                                          cordoned, a taint, a Node condition, a goal, a pod
                                          not running, lent; recheck, a health check's hand-back
                                          (K8S; set and lifted by the syncer, slonk.align)

Only HEALTH drains are the machine's: only they are lifted by a passing check or recycled.
A reason that does not parse as one of these is treated as a person's, and left alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slonk.config import check_names

PREFIX = "slonk:"
HEALTH, HOOK, QUARANTINE, POD = "health", "hook", "quarantine", "pod"
SCALE_DOWN = "scale-down"
K8S = "k8s"
# Health checks of their own kind, named `<word>:<check>`: active ones (slonk.health.active)
# and trend rules (slonk.health.trend).
ACTIVE, TREND = check_names.ACTIVE, check_names.TREND
COMPOUND = (ACTIVE, TREND)
# Before hooks had their own word, a failed prolog drained as `slonk:prolog:<script>: ...`:
# such drains may still stand after an upgrade, and are hooks' too.
LEGACY_HOOK_WORDS = ("prolog", "epilog")
# Never a health check's name.
RESERVED = (HOOK, QUARANTINE, POD, SCALE_DOWN, K8S, *LEGACY_HOOK_WORDS, *COMPOUND)
MAX_LENGTH = 250  # keeps `scontrol show node` readable
WORD = re.compile(r"[a-z][a-z0-9_-]*")


@dataclass(frozen=True)
class Cause:
    kind: str  # HEALTH, HOOK, QUARANTINE, POD, SCALE_DOWN or K8S
    name: str  # the check for HEALTH, `<phase>:<script>` for HOOK, the cause for K8S, else the kind


def _reason(head: str, detail: str) -> str:
    """One line of printable ASCII, whatever a script's name or a check's detail holds:
    slonk reads reasons from JSON, but people read them in `sinfo` and `scontrol` text and in
    logs, where a line end (U+2028, NEL, FS, VT... for Python's splitlines()) would cut them.
    Blanks become spaces, anything else a `?`."""
    text = f"{PREFIX}{head}: {detail}"
    return "".join(char if " " <= char <= "~" else " " if char.isspace() else "?" for char in text)[
        :MAX_LENGTH
    ]


def health(check: str, detail: str) -> str:
    """A health check's drain reason; `check` a passive check's name, `active:<name>` or
    `trend:<name>`."""
    word, colon, name = check.partition(":")
    if colon and word in COMPOUND and WORD.fullmatch(name):
        return _reason(check, detail)
    if check in RESERVED or not WORD.fullmatch(check):
        raise ValueError(f"{check!r} cannot name a health check: it would read as another kind")
    return _reason(check, detail)


def hook(phase: str, script: str, detail: str) -> str:
    return _reason(f"{HOOK}:{phase}:{script}", detail)


def quarantine(detail: str) -> str:
    return _reason(QUARANTINE, detail)


def scale_down(detail: str) -> str:
    return _reason(SCALE_DOWN, detail)


def k8s(cause: str, detail: str) -> str:
    if not WORD.fullmatch(cause):
        raise ValueError(f"{cause!r} cannot name a Kubernetes cause")
    return _reason(f"{K8S}:{cause}", detail)


def classify(reason: str) -> Cause | None:
    """Who wrote a drain reason; None for one slonk did not write (a person's)."""
    if not reason.startswith(PREFIX):
        return None
    word, colon, rest = reason.removeprefix(PREFIX).partition(":")
    if not colon or not WORD.fullmatch(word):
        return None
    if word == HOOK or word in LEGACY_HOOK_WORDS:
        script = rest.split(": ", 1)[0]
        return Cause(HOOK, script if word == HOOK else f"{word}:{script}")
    if word == K8S:
        cause, colon, _ = rest.partition(": ")
        return Cause(K8S, cause) if colon and WORD.fullmatch(cause) else None
    if word in (QUARANTINE, POD, SCALE_DOWN):
        return Cause(word, word)
    if word in COMPOUND:
        name, colon, _ = rest.partition(": ")
        return Cause(HEALTH, f"{word}:{name}") if colon and WORD.fullmatch(name) else None
    if not rest.startswith(" "):
        return None  # `slonk:gpu:x` is no check's reason: not ours
    return Cause(HEALTH, word)
