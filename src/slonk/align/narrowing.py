"""Which node a failing multi-node check needs: group testing over runs of fewer nodes
(slonk.align.fabric runs them). Pure: the runs so far in, the nodes named and the next runs
worth making out.

A run over several nodes that fails says only that one of them, or the fabric between them,
is at fault; a run that passes clears its nodes. A node is named only by failing runs of it
beside CONFIRM cleared nodes, one at least of every side the cleared nodes form (nodes that
passed together, or through others that did), beside every other node so accused, and in
one of those pairs twice (the one run made twice). One failure may be a flaky moment, of the
node or of its partner; and a group may span two
switches with the link between them down, where every node fails beside the far side's and
passes beside its own: the side test keeps such nodes from being named, and a node alone on
its side (its own link down) is named, rightly. To get there:
- a failing set of four or more suspects (its nodes not cleared) is tried in halves;
- a smaller one, each suspect beside cleared nodes; with none cleared yet, in pairs among
  the two smallest sets and with members of the group no run has had yet;
- what is left of a failing set beside a node it named is tried again (a second fault).
When no new run can narrow further, or MAX_RUNS were made, the search is over with what it
named: a failure that nothing narrows (every run fails: a dead switch, a program that fails
everywhere; or only the whole group fails) names nobody.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

MIN_NODES = 2
CONFIRM = 2
# A search ends after this many runs whatever it found: one bad node among 20 takes 11.
MAX_RUNS = 32


@dataclass
class Run:
    """One job of a check over some nodes of a group, and what it found."""

    nodes: list[str]
    passed: bool
    job: str
    said: str = ""  # a failed run's program's last line (check_jobs.SAID)


def _cleared(runs: Sequence[Run]) -> set[str]:
    return {n for r in runs if r.passed for n in r.nodes}


def _beside(runs: Sequence[Run], cleared: set[str]) -> dict[str, set[str]]:
    """Each suspect's cleared partners in failing runs of two."""
    found: dict[str, set[str]] = {}
    for r in runs:
        if r.passed or len(r.nodes) != MIN_NODES:
            continue
        a, b = r.nodes
        for suspect, partner in ((a, b), (b, a)):
            if partner in cleared and suspect not in cleared:
                found.setdefault(suspect, set()).add(partner)
    return found


def _sides(runs: Sequence[Run]) -> list[set[str]]:
    """The cleared nodes in sets that reach each other: two that passed in one run, and so on
    (nodes on one side of a link down are never joined to the other side's)."""
    sides: list[set[str]] = []
    for r in runs:
        if not r.passed:
            continue
        joined = set(r.nodes).union(*(s for s in sides if s & set(r.nodes)))
        sides = [s for s in sides if not s & joined] + [joined]
    return sides


def _accused(runs: Sequence[Run]) -> set[str]:
    """The nodes that failed beside CONFIRM cleared nodes, one at least of every side
    (`_sides`): a node on one side of a link down passes beside its own."""
    sides = _sides(runs)
    return {
        node
        for node, partners in _beside(runs, _cleared(runs)).items()
        if len(partners) >= CONFIRM and all(partners & side for side in sides)
    }


def _unpaired(runs: Sequence[Run], node: str, accused: set[str]) -> list[str]:
    """The other `accused` nodes `node` has not been tried beside alone: with a link down
    between two sides of a group, the nodes of the smaller side are all accused, and pass
    beside each other."""
    pairs = {frozenset(r.nodes) for r in runs if len(r.nodes) == MIN_NODES}
    return sorted(m for m in accused - {node} if frozenset((node, m)) not in pairs)


def _failed_pairs(runs: Sequence[Run], node: str) -> Counter[frozenset[str]]:
    """How often each run of `node` beside one cleared node failed."""
    cleared = _cleared(runs)
    return Counter(
        frozenset(r.nodes)
        for r in runs
        if not r.passed and len(r.nodes) == MIN_NODES and node in r.nodes
        and set(r.nodes) - {node} <= cleared
    )  # fmt: skip


def named(runs: Sequence[Run]) -> set[str]:
    """The nodes the runs name: each failed beside cleared nodes of every side, beside every
    other node accused so, and once more beside one of them (one failure may be noise)."""
    accused = _accused(runs)
    return {
        node
        for node in accused
        if not _unpaired(runs, node, accused) and max(_failed_pairs(runs, node).values()) >= 2
    }


def _repeats(runs: Sequence[Run]) -> list[list[str]]:
    """The one run made twice: an accused node's first failing pair, before it is named."""
    found = []
    accused = _accused(runs)
    for node in sorted(accused):
        pairs = _failed_pairs(runs, node)
        if not _unpaired(runs, node, accused) and max(pairs.values()) < 2:
            first = next(r.nodes for r in runs if frozenset(r.nodes) in pairs)
            found.append(list(first))
    return found


def next_runs(runs: Sequence[Run], members: Sequence[str]) -> list[list[str]]:
    """The runs that would narrow the search down, best first, none made before; empty when
    the search is over. `members`: the group's nodes, in its order."""
    if len(runs) >= MAX_RUNS:
        return []
    cleared = _cleared(runs)
    beside = _beside(runs, cleared)
    found = named(runs)
    good = sorted(cleared)
    spare = [m for m in members if not any(m in r.nodes for r in runs)]
    sides = _sides(runs)
    accused = _accused(runs)
    tries = [[node, m] for node in sorted(accused) for m in _unpaired(runs, node, accused)]
    for node, partners in sorted(beside.items()):
        if node in found:
            continue
        # A node of each side it has not failed beside yet, then any other.
        tries += [[node, min(side)] for side in sides if not partners & side]
        tries += [[node, p] for p in good if p not in partners]
    open_sets = []
    for r in runs:
        suspects = [n for n in r.nodes if n not in cleared]
        rest = [n for n in suspects if n not in found]
        if r.passed or not rest:
            continue  # passed, or explained: by a named node, or between cleared nodes
        if len(rest) < len(suspects):  # beside a named node: whether the rest is sound
            tries.append(rest + [*good, *spare][: max(0, MIN_NODES - len(rest))])
        else:
            open_sets.append(rest)
    open_sets.sort(key=len)
    # One side cleared: the suspects' own pairs first, which may clear the other side.
    together = len(sides) <= 1
    for suspects in open_sets:
        if len(suspects) >= 2 * MIN_NODES:
            half = len(suspects) // 2
            tries += [suspects[:half], suspects[half:]]
        elif together:
            tries += [list(pair) for pair in itertools.combinations(suspects, MIN_NODES)]
        tries += [[s, p] for s in suspects for p in good]
    if not cleared and open_sets:
        pool = list(dict.fromkeys(n for s in open_sets[:2] for n in s))
        tries += [list(pair) for pair in itertools.combinations(pool, MIN_NODES)]
        tries += [[s, m] for s in open_sets[0] for m in spare]
    made = {frozenset(r.nodes) for r in runs}
    fresh: dict[frozenset[str], list[str]] = {frozenset(t): t for t in _repeats(runs)}
    for t in tries:
        key = frozenset(t)
        if len(key) >= MIN_NODES and key not in made:
            fresh.setdefault(key, t)
    return list(fresh.values())


def blame(node: str, runs: Sequence[Run], program: str) -> str:
    """Why `node` is named: the cleared nodes it failed beside, and its failing runs."""
    partners = sorted(_beside(runs, _cleared(runs)).get(node, set()))
    failed = [r for r in runs if not r.passed and node in r.nodes]
    jobs = ", ".join(r.job for r in failed)
    why = f"{program} failed beside {len(partners)} nodes that pass without it (job {jobs})"
    said = next((r.said for r in reversed(failed) if r.said), "")
    return f"{why}: {said}" if said else why
