"""The cluster spec and the Slurm configuration rendered from it."""
