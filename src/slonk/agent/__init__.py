"""`slonk agent --role ROLE`: a pod's own loops in one long-running process (the s6 service
`agent`), each a thread (slonk.agent.runner), woken by inotify (slonk.agent.changes)."""
