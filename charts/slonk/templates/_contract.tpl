{{- /* Written by `python -m slonk.config.contract` from slonk.config: edit that. */}}
{{- /* How many node pools, replicas in a pool and Slurm nodes in all the chart renders. */}}
{{- define "slonk.scaleBounds" -}}
{"pools": 100, "replicas": 10000, "nodes": 20000}
{{- end }}
{{- /* Settings slonk derives from the spec, with Slurm's aliases, lower case (Slurm reads keys in any case): spec.MANAGED_KEYS. */}}
{{- define "slonk.managedSlurmKeys" -}}
authaltparameters authalttypes backupaddr backupcontroller clustername controladdr controlmachine downnodes frontendname include nodename nodeset partitionname slurmctldaddr slurmctldhost slurmctldlogfile slurmctldport slurmdlogfile slurmdport
{{- end }}
{{- /* Pool names whose StatefulSet or node names would be another component's, and Slurm's keyword for defaults: spec.RESERVED_POOL_NAMES. */}}
{{- define "slonk.reservedPoolNames" -}}
controller login ldap slurmdbd mariadb restapi default
{{- end }}
{{- /* What slonk writes on a partition's line: spec.PARTITION_KEYS. */}}
{{- define "slonk.partitionKeys" -}}
default defaulttime maxtime nodes partitionname preemptmode priority prioritytier state
{{- end }}
