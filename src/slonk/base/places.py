"""The locations the programs Slurm forks for every job read, as plain strings: those
programs must not pay for importing pathlib (it brings `re` and `glob`). slonk.base.paths wraps
them in Paths for everyone else."""

HOOKS_STATE = "/var/lib/slonk/hooks"
HOOK_LOGS = "/var/log/slonk/hooks"
HEALTH_STATE = "/run/slonk/health"
HEALTH_PLAN = HEALTH_STATE + "/plan.json"
