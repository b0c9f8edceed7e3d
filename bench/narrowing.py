"""How well a failing check that spans a block is narrowed down (slonk.align.narrowing), on the
function alone: no Slurm, no cluster. Prints one JSON document.

Each search starts from a failing run over the whole group and always makes the first run
the function offers, the answer of each run drawn from a fault model:
- one bad node, every position, groups of 2 to 20: whether the node named is the bad one,
  and the most runs a search took (the first, failing run counted);
- two and three bad nodes, every combination, groups of 3 to 10: healthy nodes named (the
  harm: a machine drained for nothing) and bad ones missed;
- no bad node, but the link between two switches of the group down, with and without 5%
  noise: searches that named a node;
- a flaky bad node (failing half its runs) and noise (every run failing by itself with a
  chance), groups of 8, SEARCHES seeded searches each: searches that named a healthy node,
  and that named the bad one.
No baseline: before this, a check that spans a block did not exist.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable

from slonk.align import narrowing

SEARCHES = 2000
SEED = 1


def search(group: list[str], fails: Callable[[frozenset[str]], bool]) -> tuple[set[str], int]:
    runs = [narrowing.Run(group, False, "1")]
    while tries := narrowing.next_runs(runs, group):
        runs.append(narrowing.Run(tries[0], not fails(frozenset(tries[0])), str(len(runs) + 1)))
    return narrowing.named(runs), len(runs)


def nodes(count: int) -> list[str]:
    return [f"n{i:02}" for i in range(count)]


def one_bad() -> dict[str, object]:
    worst, right = {}, 0
    for size in range(2, 21):
        most = 0
        for bad in nodes(size):
            named, runs = search(nodes(size), lambda run, bad=bad: bad in run)
            right += named == ({bad} if size > 2 else set())
            most = max(most, runs)
        worst[size] = most
    return {"named_right": right, "searches": sum(range(2, 21)), "most_runs_by_size": worst}


def several_bad() -> dict[str, int]:
    cases = healthy_named = missed = 0
    for size in range(3, 11):
        for count in (2, 3):
            for bad in map(set, itertools.combinations(nodes(size), count)):
                named, _ = search(nodes(size), lambda run, bad=bad: bool(run & bad))
                cases += 1
                healthy_named += bool(named - bad)
                missed += len(bad - named)
    return {"cases": cases, "healthy_named": healthy_named, "bad_missed": missed}


def link_down() -> dict[str, int]:
    """Groups of 4 to 20 over two switches, the link between them down (a run fails when it
    spans both sides), every cut with two or more nodes a side, in three orders of members;
    then the same with every run failing 5% of the time besides (seeded)."""
    found = {}
    rng = random.Random(SEED)
    for noise in (0.0, 0.05):
        searches = named_someone = 0
        for size in range(4, 21):
            for cut in range(2, size - 1):
                left = set(nodes(size)[:cut])
                for order in (nodes(size), nodes(size)[::-1], nodes(size)[1::2] + nodes(size)[::2]):

                    def fails(
                        run: frozenset[str], left: set[str] = left, noise: float = noise
                    ) -> bool:
                        return (bool(run & left) and bool(run - left)) or rng.random() < noise

                    named, _ = search(order, fails)
                    searches += 1
                    named_someone += bool(named)
        found[f"noise_{noise:.2f}"] = named_someone
    return {"searches": searches, **found}


def flaky() -> dict[str, object]:
    found: dict[str, object] = {"searches": SEARCHES}
    rng = random.Random(SEED)
    for noise in (0.0, 0.05, 0.10):
        wrong = right = 0
        for _ in range(SEARCHES):
            bad = rng.choice(nodes(8))

            def fails(run: frozenset[str], bad: str = bad, noise: float = noise) -> bool:
                return (bad in run and rng.random() < 0.5) or rng.random() < noise

            named, _ = search(nodes(8), fails)
            wrong += bool(named - {bad})
            right += bad in named
        found[f"noise_{noise:.2f}"] = {"healthy_named": wrong, "bad_named": right}
    return found


def main() -> None:
    print(
        json.dumps(
            {
                "one_bad_node": one_bad(),
                "two_or_three_bad_nodes": several_bad(),
                "link_down_between_two_sides": link_down(),
                "flaky_bad_node": flaky(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
