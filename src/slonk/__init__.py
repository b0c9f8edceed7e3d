"""Slonk: Slurm on Kubernetes."""

from importlib.metadata import version

__version__ = version("slonk")
