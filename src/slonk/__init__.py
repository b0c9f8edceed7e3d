"""Slonk: Slurm on Kubernetes."""
