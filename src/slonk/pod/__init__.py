"""What a pod runs beside Slurm's daemons, started by `slonk init` and the pod's agent: its s6
services, sshd and the development directory, the munge key and host keys, the worker's cgroup
tree and mount namespaces, the programs slurm.conf names, the tasks that follow cluster.yaml
and srun's ports, and a worker's orderly stop."""
