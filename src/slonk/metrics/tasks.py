"""The agent's own tasks as metrics (slonk.agent.runner's Board): a loop that fails, or keeps
failing, shows here as well as in the pod's log."""

from __future__ import annotations

from slonk.agent.runner import Board
from slonk.metrics.family import COUNTER, GAUGE, Family


def task_families(board: Board) -> list[Family]:
    """slonk_agent_task_up, _failures_total, _start_timestamp_seconds,
    _last_failure_timestamp_seconds{task}: the task names are the agent's, never a user's."""
    labels = ("task",)
    up = Family("slonk_agent_task_up", GAUGE, "Whether the agent's task runs (1), or waits to "
                "start again after a failure or has ended (0).", labels)  # fmt: skip
    failures = Family("slonk_agent_task_failures_total", COUNTER, "Times the task failed "
                      "(raised) and was started again after a back-off.", labels)  # fmt: skip
    started = Family("slonk_agent_task_start_timestamp_seconds", GAUGE, "When the task last "
                     "started, in seconds since the epoch.", labels)  # fmt: skip
    failed = Family("slonk_agent_task_last_failure_timestamp_seconds", GAUGE, "When the task "
                    "last failed, in seconds since the epoch; 0: never.", labels)  # fmt: skip
    for name, state in sorted(board.snapshot().items()):
        up.set(1.0 if state.running else 0.0, name)
        failures.set(state.failures, name)
        started.set(state.started, name)
        failed.set(state.failed, name)
    return [up, failures, started, failed]
