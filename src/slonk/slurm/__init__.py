"""Slurm plumbing: reading node and job state, draining and resuming nodes, slurmctld under s6
and its state on disk, the controller's record of its configuration, and power saving's
programs (lending machines to Kubernetes in Slurm's words)."""
