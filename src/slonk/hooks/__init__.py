"""Job hooks from git: checked revisions, and the dispatcher Slurm runs."""
