"""The words that name checks of their own kind, in a node's plan, results, metrics and drain
reasons (`slonk:active:<check>`, `slonk:trend:<rule>`): imported by the job-time path, so
nothing beyond them (the catalogues: slonk.config.active_checks, slonk.config.trends)."""

ACTIVE = "active"  # also the phase active checks run in as Slurm jobs
TREND = "trend"
ACTIVE_PREFIX = f"{ACTIVE}:"
TREND_PREFIX = f"{TREND}:"

# A site's active check's `span` (slonk.config.active_checks.SPAN): the node's own, or a
# block's, which the controller runs over several nodes (slonk.align.fabric).
SPAN = "span"
NODE, BLOCK = "node", "block"
