"""Slurm and Kubernetes kept in agreement about every node: the syncer, `slonk align`, the
recycle loop (a drained node's pod made again; quarantine), and the schedule of active checks
(each node's own, and those that span a block)."""
