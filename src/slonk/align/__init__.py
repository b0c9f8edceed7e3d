"""Slurm and Kubernetes kept in agreement about every node: the syncer and `slonk align`."""
