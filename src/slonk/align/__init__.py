"""Slurm and Kubernetes kept in agreement about every node: the syncer, `slonk align`, and the
recycle loop (a drained node's pod made again; quarantine)."""
