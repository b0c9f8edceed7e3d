"""The machinery of `slonk agent --role ROLE` (slonk.pod_agent, the s6 service `agent`): a
pod's own loops in one long-running process, each a thread (slonk.agent.runner), woken by
inotify (slonk.agent.changes). Below the loops themselves: metrics and config-watch use it."""
