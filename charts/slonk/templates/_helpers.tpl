{{/* Names. Pods and Slurm nodes are named from the release: <release>-<pool>-<i>. */}}

{{- define "slonk.chart" -}}
{{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "slonk.serviceAccountName" -}}
{{ .Values.serviceAccount.name | default .Release.Name }}
{{- end }}

{{- /* "true" when the controller runs the recycle loop and needs the Kubernetes API. */}}
{{- define "slonk.recycles" -}}
{{ and .Values.health.enabled .Values.health.recycle.enabled }}
{{- end }}

{{- /* The controller talks to the Kubernetes API: the syncer or the recycle loop runs. */}}
{{- define "slonk.controllerApi" -}}
{{ or .Values.syncer.enabled (eq (include "slonk.recycles" .) "true") }}
{{- end }}

{{- /* The controller's account: its own unless the operator brings the accounts. */}}
{{- define "slonk.controllerServiceAccount" -}}
{{- if .Values.serviceAccount.create }}{{ .Release.Name }}-controller
{{- else }}{{ include "slonk.serviceAccountName" . }}{{ end }}
{{- end }}

{{- define "slonk.mungeSecret" -}}
{{ .Values.munge.existingSecret | default (printf "%s-munge" .Release.Name) }}
{{- end }}

{{- define "slonk.jwtSecret" -}}
{{ .Values.restapi.jwt.existingSecret | default (printf "%s-jwt" .Release.Name) }}
{{- end }}

{{/* The JWT key for slurmctld and slurmdbd, which verify users' tokens while the REST API is
on (values: restapi); each nothing when it is off. */}}
{{- define "slonk.jwtVolume" -}}
{{- if .Values.restapi.enabled }}
- name: jwt-key
  secret: {secretName: {{ include "slonk.jwtSecret" . | quote }}, defaultMode: 0400}
{{- end }}
{{- end }}

{{- define "slonk.jwtMount" -}}
{{- if .Values.restapi.enabled }}
- {name: jwt-key, mountPath: /var/run/secrets/slonk/jwt, readOnly: true}
{{- end }}
{{- end }}

{{- /* The container security context of slurmdbd and MariaDB, as the controller's
(controller.securityContext): init and s6 run as root and write the munge key and the daemons'
files; munged, slurmdbd and mariadbd switch to their own users (SETUID, SETGID); s6 signals
them (KILL). Nothing else. */}}
{{- define "slonk.serviceSecurityContext" -}}
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
  add: [CHOWN, DAC_OVERRIDE, FOWNER, KILL, SETGID, SETUID]
seccompProfile: {type: RuntimeDefault}
{{- end }}

{{- define "slonk.sshSecret" -}}
{{ .Values.ssh.existingSecret | default (printf "%s-ssh-host-keys" .Release.Name) }}
{{- end }}

{{- /* The ssh Secrets' volumes and mounts (host keys; the users' CA, when given), for every
pod that runs sshd: the login pods, and the workers with workers.ssh. */}}
{{- define "slonk.sshVolumes" -}}
- name: ssh-host-keys
  secret: {secretName: {{ include "slonk.sshSecret" . | quote }}, defaultMode: 0400}
{{- with .Values.ssh.trustedUserCAKeys }}
- name: ssh-user-ca
  secret: {secretName: {{ . | quote }}, items: [{key: ca.pub, path: ca.pub}], defaultMode: 0444}
{{- end }}
{{- end }}

{{- define "slonk.sshMounts" -}}
- {name: ssh-host-keys, mountPath: /var/run/secrets/slonk/ssh, readOnly: true}
{{- if .Values.ssh.trustedUserCAKeys }}
- {name: ssh-user-ca, mountPath: /var/run/secrets/slonk/ssh-ca, readOnly: true}
{{- end }}
{{- end }}

{{/* Labels: app.kubernetes.io/* on everything but the node Services (services.yaml), the
component on pods and the Services of a role. */}}
{{- define "slonk.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end }}

{{- define "slonk.labels" -}}
{{ include "slonk.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: slonk
helm.sh/chart: {{ include "slonk.chart" . }}
{{- end }}

{{/* Call with (dict "root" $ "component" "worker" "pool" "cpu"); pool is optional, quoted: a
pool may be named `on` or `1`, which YAML would read as no string. */}}
{{- define "slonk.componentSelector" -}}
{{ include "slonk.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- with .pool }}
slonk.io/nodepool: {{ . | quote }}
{{- end }}
{{- end }}

{{- define "slonk.componentLabels" -}}
{{ include "slonk.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- with .pool }}
slonk.io/nodepool: {{ . | quote }}
{{- end }}
{{- end }}

{{/* Call with (dict "root" $ "image" .Values.images.worker). */}}
{{- define "slonk.image" -}}
{{- $images := .root.Values.images -}}
{{- $tag := $images.tag | default .root.Chart.AppVersion -}}
{{- if $images.registry -}}
{{ printf "%s/%s:%s" $images.registry .image $tag }}
{{- else -}}
{{ printf "%s:%s" .image $tag }}
{{- end }}
{{- end }}

{{/* The environment every slonk container reads. SLURM_CONF_SERVER: Slurm runs configless,
clients in `kubectl exec` sessions fetch slurmctld's configuration from there (`slonk init`
sets the same, from cluster.yaml, for the pod's services). */}}
{{- define "slonk.podEnv" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
- name: SLURM_CONF_SERVER
  value: {{ include "slonk.confServer" . | quote }}
{{- end }}

{{/* Where slurmctld answers (slonk.config.model's controller_addresses, slonk.config.render's
conf_server): the controller's Service, or with a backup each controller pod's own name, in
SlurmctldHost's order, since a client tries one after the other. */}}
{{- define "slonk.confServer" -}}
{{- $domain := printf "%s.svc.%s" .Release.Namespace .Values.clusterDomain -}}
{{- $port := int .Values.slurm.slurmctldPort -}}
{{- if .Values.controller.backup.enabled -}}
{{- printf "%s-controller-0.%s-pods.%s:%d,%s-controller-1.%s-pods.%s:%d" .Release.Name .Release.Name $domain $port .Release.Name .Release.Name $domain $port -}}
{{- else -}}
{{- printf "%s-controller.%s:%d" .Release.Name $domain $port -}}
{{- end -}}
{{- end }}

{{/* Volumes and mounts shared by every pod: the cluster spec, the munge key, /home. */}}
{{- define "slonk.commonVolumes" -}}
- name: cluster
  configMap: {name: {{ .Release.Name }}-cluster}
- name: munge-key
  secret: {secretName: {{ include "slonk.mungeSecret" . | quote }}, defaultMode: 0400}
- name: home
{{- if .Values.home.existingClaim }}
  persistentVolumeClaim: {claimName: {{ .Values.home.existingClaim | quote }}}
{{- else if .Values.home.nfs.server }}
  nfs: {server: {{ .Values.home.nfs.server }}, path: {{ .Values.home.nfs.path }}, readOnly: {{ .Values.home.nfs.readOnly | default false }}}
{{- else }}
  persistentVolumeClaim: {claimName: {{ .Release.Name }}-home}
{{- end }}
{{- with .Values.ldap.bindPasswordSecret }}
- name: ldap-bind
  secret: {secretName: {{ . | quote }}, defaultMode: 0400}
{{- end }}
{{- with .Values.ldap.caSecret }}
- name: ldap-ca
  secret: {secretName: {{ . | quote }}}
{{- end }}
{{- end }}

{{- define "slonk.commonMounts" -}}
- {name: cluster, mountPath: /etc/slonk, readOnly: true}
- {name: munge-key, mountPath: /var/run/secrets/slonk/munge, readOnly: true}
- {name: home, mountPath: /home}
{{- if .Values.ldap.bindPasswordSecret }}
- {name: ldap-bind, mountPath: /var/run/secrets/slonk/ldap-bind, readOnly: true}
{{- end }}
{{- if .Values.ldap.caSecret }}
- {name: ldap-ca, mountPath: /var/run/secrets/slonk/ldap-ca, readOnly: true}
{{- end }}
{{- end }}

{{/* The site's scratch volume (values scratch) at /scratch on the login pods and workers;
each nothing without one. */}}
{{- define "slonk.scratchVolume" -}}
{{- $claim := .Values.scratch.existingClaim }}
{{- if and $claim (.Values.scratch.nfs | default dict).server }}
{{- fail "scratch: set existingClaim or nfs, not both" }}
{{- end }}
{{- if and $claim (eq $claim .Values.home.existingClaim) }}
{{- fail (printf "scratch.existingClaim: %q is /home's claim (home.existingClaim); scratch is a volume of its own" $claim) }}
{{- end }}
{{- with .Values.scratch }}
{{- if .existingClaim }}
- name: scratch
  persistentVolumeClaim: {claimName: {{ .existingClaim | quote }}}
{{- else if (.nfs | default dict).server }}
- name: scratch
  nfs: {server: {{ .nfs.server | quote }}, path: {{ .nfs.path | quote }}}
{{- end }}
{{- end }}
{{- end }}

{{- define "slonk.scratchMount" -}}
{{- if or .Values.scratch.existingClaim (.Values.scratch.nfs | default dict).server }}
- {name: scratch, mountPath: /scratch}
{{- end }}
{{- end }}

{{/* A Secret slonk generates (its values' existingSecret empty), made once: an upgrade finds
it with `lookup` and keeps its value, and uninstall leaves it (resource-policy keep), so a
reinstall does not strand running nodes or a database. Call with (dict "root" . "name" NAME
"key" KEY "value" NEW), NEW base64 as a Secret's data is. */}}
{{- define "slonk.keptSecret" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .name -}}
apiVersion: v1
kind: Secret
metadata:
  name: {{ .name }}
  labels: {{- include "slonk.labels" .root | nindent 4 }}
  annotations:
    helm.sh/resource-policy: keep
type: Opaque
data:
  {{ .key }}: {{ (and $existing (index $existing.data .key)) | default .value }}
{{- end }}

{{- define "slonk.imagePullSecrets" -}}
{{- with .Values.images.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* Pod placement: call with the component's values (nodeSelector, tolerations, affinity). */}}
{{- define "slonk.placement" -}}
{{- with .nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
A list where a map keyed by name is wanted (nodepools and partitions before chart 0.4.0) fails
showing the map to write: the same text as slonk.config.spec._old_list_form. Call with
(dict "key" "nodepools" "value" $list).
*/}}
{{- define "slonk.refuseList" -}}
{{- if kindIs "slice" .value -}}
{{- $converted := dict -}}
{{- range $i, $item := .value -}}
{{- if kindIs "map" $item -}}
{{- $_ := set $converted (toString (get $item "name" | default (printf "<name of item %d>" $i))) (omit $item "name") -}}
{{- end -}}
{{- end -}}
{{- fail (printf "%s: a list, the form before chart 0.4.0; write a map keyed by name instead: %s: %s" .key .key (toJson $converted)) -}}
{{- end -}}
{{- end }}

{{/*
"true" when the node pools are within the chart's bounds, whatever form the values take
(`helm --skip-schema-validation` too): a map of at most 100 pools, each replicas an integer in
0..10000, 20,000 in all; otherwise it fails naming the key, and a list (the form before chart
0.4.0) shows the map to write. The templates that make objects per pool or per node
(workers.yaml, services.yaml, which Helm renders first) loop only inside `if` it: `helm lint`
turns `fail` into a log line and goes on, and would then loop over whatever it was given.
Each check runs only if those before it passed. Linear in the pools.
*/}}
{{- define "slonk.boundNodes" -}}
{{- $bounds := include "slonk.scaleBounds" . | fromJson -}}
{{- include "slonk.refuseList" (dict "key" "nodepools" "value" .Values.nodepools) -}}
{{- include "slonk.refuseList" (dict "key" "partitions" "value" .Values.partitions) -}}
{{- $pools := .Values.nodepools | default dict -}}
{{- $error := "" -}}
{{- if not (kindIs "map" $pools) -}}
{{- $error = printf "nodepools: a map keyed by pool name is wanted, got %s" (kindOf $pools) -}}
{{- else if gt (len $pools) (int $bounds.pools) -}}
{{- $error = printf "nodepools: %d pools; at most %d" (len $pools) (int $bounds.pools) -}}
{{- end -}}
{{- $nodes := 0 -}}
{{- range $name, $pool := ternary $pools dict (empty $error) -}}
{{- $replicas := 0 -}}
{{- if $error -}}
{{- else if not (or (kindIs "invalid" $pool) (kindIs "map" $pool)) -}}
{{- $error = printf "nodepools.%s: a map is wanted (or null), got %s" $name (kindOf $pool) -}}
{{- else -}}
{{- $replicas = dig "replicas" 0 ($pool | default dict) -}}
{{- end -}}
{{- if $error -}}
{{- else if not (or (kindIs "float64" $replicas) (kindIs "int64" $replicas) (kindIs "int" $replicas)) -}}
{{- $error = printf "nodepools.%s.replicas: an integer is wanted, got %s" $name (kindOf $replicas) -}}
{{- /* Written so that NaN fails too: no comparison with it is true. */ -}}
{{- else if not (and (ge (float64 $replicas) 0.0) (le (float64 $replicas) (float64 $bounds.replicas))) -}}
{{- $error = printf "nodepools.%s.replicas: %v is outside 0..%d" $name $replicas (int $bounds.replicas) -}}
{{- else -}}
{{- $nodes = add $nodes (int $replicas) -}}
{{- end -}}
{{- end -}}
{{- if and (not $error) (gt $nodes (int $bounds.nodes)) -}}
{{- $error = printf "nodepools: %d Slurm nodes in all; at most %d (each is a pod and a Service)" $nodes (int $bounds.nodes) -}}
{{- end -}}
{{- if $error }}{{ fail $error }}{{ else }}true{{ end -}}
{{- end }}

{{/*
Checks the schema cannot express. Each failure names the values key, as the schema does.
*/}}
{{- define "slonk.validate" -}}
{{- if or (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" .Release.Name)) (gt (len .Release.Name) 41) -}}
{{- fail (printf "release name %q: must be a DNS-1123 label of at most 41 characters (it prefixes every Slurm node name, and StatefulSet names of at most 52)" .Release.Name) -}}
{{- end -}}
{{- include "slonk.refuseList" (dict "key" "nodepools" "value" .Values.nodepools) -}}
{{- include "slonk.refuseList" (dict "key" "partitions" "value" .Values.partitions) -}}
{{- include "slonk.validateGroupAccounts" . -}}
{{- include "slonk.validateDatabase" . -}}
{{- if not (kindIs "invalid" (index .Values.workers "terminationGracePeriodSeconds")) -}}
{{- fail "workers.terminationGracePeriodSeconds: removed; a worker pod's grace is now workers.drainTimeoutSeconds (for its jobs to end) + workers.stopMarginSeconds (to stop slurmd): set those instead" -}}
{{- end -}}
{{- if not (kindIs "invalid" (index .Values.metrics "serviceMonitor")) -}}
{{- fail "metrics.serviceMonitor: removed; Prometheus now finds the exporters through a PodMonitor, metrics.podMonitor (same keys): set that instead, and check that your Prometheus selects PodMonitors (its podMonitorSelector)" -}}
{{- end -}}
{{- $pools := dict -}}
{{- $reserved := include "slonk.reservedPoolNames" . | splitList " " -}}
{{- range $name, $pool := .Values.nodepools -}}
{{- with $pool -}}
{{- if has $name $reserved -}}
{{- fail (printf "nodepools.%s: %q is reserved for slonk's own pods" $name $name) -}}
{{- end -}}
{{- /* Also the schema's; here too since names are written into text (node Services). */ -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "nodepools.%s: %q is not a DNS-1123 label (lowercase letters, digits and '-', at most 63 characters)" $name $name) -}}
{{- end -}}
{{- $_ := set $pools $name true -}}
{{- $statefulSet := printf "%s-%s" $.Release.Name $name -}}
{{- if gt (len $statefulSet) 52 -}}
{{- fail (printf "nodepools.%s: StatefulSet name %q is longer than 52 characters (Kubernetes would make none of its pods)" $name $statefulSet) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $default := "" -}}
{{- range $name, $part := .Values.partitions -}}
{{- with $part -}}
{{- if eq (lower $name) "default" -}}
{{- fail (printf "partitions.%s: %q is Slurm's keyword for the defaults of the partitions after it, not a partition" $name $name) -}}
{{- end -}}
{{- range $j, $pool := .pools -}}
{{- if not (hasKey $pools $pool) -}}
{{- fail (printf "partitions.%s.pools[%d]: unknown nodepool %q" $name $j $pool) -}}
{{- end -}}
{{- end -}}
{{- if .default -}}
{{- if $default -}}
{{- fail (printf "partitions.%s.default: only one partition can be the default (%s is)" $name $default) -}}
{{- end -}}
{{- $default = $name -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $ldap := .Values.ldap -}}
{{- if and $ldap.enabled (not $ldap.dev.enabled) -}}
{{- range $key := list "uris" "userBase" "groupBase" -}}
{{- if not (index $ldap $key) -}}
{{- fail (printf "ldap.%s: required when ldap.enabled is true (or enable ldap.dev)" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.hooks.enabled (not .Values.hooks.git.repo) -}}
{{- fail "hooks.git.repo: required when hooks.enabled is true" -}}
{{- end -}}
{{- /* The walk below includes a template per value: walk only when the values' JSON shows a
control character (escaped as \b \f \n \r \t or \u0000-\u001f; DEL is written as is) or
a number of 10 digits or an exponent, or when there is no JSON (an infinite or NaN number). A
match inside a string, or where the walk does not go, only costs the walk. */ -}}
{{- $json := toJson .Values -}}
{{- if or (not $json) (regexMatch `\\[bfnrt]|\\u00[01]|\x7f|[0-9]{10}|[0-9]e[-+]?[0-9]` $json) -}}
{{- include "slonk.refuseUnsafeValues" (dict "path" "" "value" .Values) -}}
{{- end -}}
{{- $managed := include "slonk.managedSlurmKeys" . | splitList " " -}}
{{- range $file := list "slurmConf" "cgroupConf" -}}
{{- include "slonk.refuseSlurmKeys" (dict "path" (printf "slurm.%s" $file) "settings" (index $.Values.slurm $file) "reserved" $managed) -}}
{{- end -}}
{{- range $name, $part := .Values.partitions -}}
{{- with $part -}}
{{- include "slonk.refuseSlurmKeys" (dict "path" (printf "partitions.%s.options" $name) "settings" .options "reserved" (include "slonk.partitionKeys" . | splitList " ")) -}}
{{- end -}}
{{- end -}}
{{- $set := dict -}}
{{- range $key, $_ := .Values.slurm.slurmConf -}}
{{- $_ := set $set (lower $key) (printf "slurmConf.%s" $key) -}}
{{- if and (eq (lower $key) "srunportrange") (ne $key "SrunPortRange") -}}
{{- fail (printf "slurm.slurmConf.%s: write it SrunPortRange (the NetworkPolicies read that key)" $key) -}}
{{- end -}}
{{- end -}}
{{- range $i, $line := .Values.slurm.extraLines -}}
{{- $key := trim $line | splitList "=" | first -}}
{{- if not (or (eq (trim $line) "") (hasPrefix "#" (trim $line))) -}}
{{- if has (lower $key) $managed -}}
{{- fail (printf "slurm.extraLines[%d]: %s is set by slonk from the spec" $i $key) -}}
{{- end -}}
{{- if hasKey $set (lower $key) -}}
{{- fail (printf "slurm.extraLines[%d]: %s is set by %s already" $i $key (get $set (lower $key))) -}}
{{- end -}}
{{- if eq (lower $key) "srunportrange" -}}
{{- fail (printf "slurm.extraLines[%d]: set SrunPortRange in slurm.slurmConf (the NetworkPolicies read it there)" $i) -}}
{{- end -}}
{{- $_ := set $set (lower $key) (printf "extraLines[%d]" $i) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{- /* Call with (dict "path" "slurm.slurmConf" "settings" $map "reserved" $lowerKeys): a key
slonk sets, or a key given twice in different case, fails naming it. */}}
{{- define "slonk.refuseSlurmKeys" -}}
{{- $seen := dict -}}
{{- range $key, $_ := .settings -}}
{{- if has (lower $key) $.reserved -}}
{{- fail (printf "%s.%s: set by slonk from the spec; change the spec instead" $.path $key) -}}
{{- end -}}
{{- if hasKey $seen (lower $key) -}}
{{- fail (printf "%s.%s: same setting as %s (Slurm ignores case)" $.path $key (get $seen (lower $key))) -}}
{{- end -}}
{{- $_ := set $seen (lower $key) $key -}}
{{- end -}}
{{- end }}

{{- /* Call with (dict "path" "" "value" .Values): no string in the values may hold a control
character (a newline would add a line to slurm.conf, passwd or a command), and no number may
be beyond 2^31-1 (`int` would wrap it, toYaml would write it as a string), as the pods' spec
parser refuses too (patterns.first_unsafe_value). Kubernetes' own objects (annotations,
resources, placement) are checked by the API server and are left to it. */}}
{{- define "slonk.refuseUnsafeValues" -}}
{{- $path := .path -}}
{{- if kindIs "map" .value -}}
{{- range $key, $item := .value -}}
{{- $at := ternary $key (printf "%s.%s" $path $key) (eq $path "") -}}
{{- if regexMatch "[\\x00-\\x1f\\x7f]" $key -}}
{{- fail (printf "%s: the key holds a control character" $at) -}}
{{- end -}}
{{- if not (has $key (list "global" "podAnnotations" "podLabels" "annotations" "resources" "nodeSelector" "tolerations" "affinity")) -}}
{{- include "slonk.refuseUnsafeValues" (dict "path" $at "value" $item) -}}
{{- end -}}
{{- end -}}
{{- else if kindIs "slice" .value -}}
{{- range $i, $item := .value -}}
{{- include "slonk.refuseUnsafeValues" (dict "path" (printf "%s[%d]" $path $i) "value" $item) -}}
{{- end -}}
{{- else if and (kindIs "string" .value) (regexMatch "[\\x00-\\x1f\\x7f]" .value) -}}
{{- fail (printf "%s: %q holds a control character (a newline, tab, ...)" $path .value) -}}
{{- else if and (or (kindIs "float64" .value) (kindIs "int64" .value) (kindIs "int" .value)) (or (gt (.value | float64) 2147483647.0) (lt (.value | float64) -2147483647.0)) -}}
{{- fail (printf "%s: %v is beyond 2147483647" $path .value) -}}
{{- end -}}
{{- end }}

{{/* The normalized cluster spec (cluster.yaml): what every pod's `slonk init` reads. */}}
{{- define "slonk.clusterSpec" -}}
{{- $pools := dict -}}
{{- range $name, $values := .Values.nodepools -}}
{{- with $values -}}
{{- $pool := dict "replicas" (int .replicas) "cpus" (int .cpus) "memoryMiB" (int .memoryMiB) -}}
{{- with .gpus }}{{ $_ := set $pool "gpus" (dict "count" (int .count) "type" (.type | default "")) }}{{ end -}}
{{- with .features }}{{ $_ := set $pool "features" . }}{{ end -}}
{{- if kindIs "float64" .weight }}{{ $_ := set $pool "weight" (int .weight) }}{{ end -}}
{{- with .topology }}{{ $_ := set $pool "topology" . }}{{ end -}}
{{- $_ := set $pools $name $pool -}}
{{- end -}}
{{- end -}}
{{- $partitions := dict -}}
{{- range $name, $partition := .Values.partitions -}}
{{- with $partition }}{{ $_ := set $partitions $name . }}{{ end -}}
{{- end -}}
{{- $slurm := .Values.slurm -}}
{{- $spec := dict
  "version" 1
  "clusterName" .Values.clusterName
  "release" .Release.Name
  "namespace" .Release.Namespace
  "clusterDomain" .Values.clusterDomain
  "slurmctldPort" (int $slurm.slurmctldPort)
  "slurmdPort" (int $slurm.slurmdPort)
  "confinement" $slurm.confinement
  "topology" $slurm.topology
  "slurmConf" $slurm.slurmConf
  "cgroupConf" $slurm.cgroupConf
  "extraLines" $slurm.extraLines
  "nodepools" $pools
  "partitions" $partitions
  "users" .Values.users
  "groups" .Values.groups
  "accounts" .Values.accounts
  "drainTimeoutSeconds" (int .Values.workers.drainTimeoutSeconds)
  "health" .Values.health
  "syncer" .Values.syncer
  "capacity" (dict "returnOnDemand" .Values.capacity.returnOnDemand)
  "priority" $slurm.priority
  "ssh" (dict "workers" .Values.workers.ssh.enabled "trustedUserCAKeys" (not (empty .Values.ssh.trustedUserCAKeys)))
-}}
{{- if .Values.metrics.enabled -}}
{{- $_ := set $spec "metrics" (dict "port" (int .Values.metrics.port)) -}}
{{- end -}}
{{- if or .Values.scratch.existingClaim (.Values.scratch.nfs | default dict).server -}}
{{- $_ := set $spec "scratch" true -}}
{{- end -}}
{{- if .Values.controller.backup.enabled -}}
{{- $_ := set $spec "backupController" (dict "takeoverSeconds" (int .Values.controller.backup.takeoverSeconds)) -}}
{{- end -}}
{{- if .Values.mail.relay -}}
{{- $_ := set $spec "mail" .Values.mail -}}
{{- end -}}
{{- if .Values.restapi.enabled -}}
{{- $_ := set $spec "restapi" (dict "port" (int .Values.restapi.port) "maxTokenLifespanSeconds" (int .Values.restapi.maxTokenLifespanSeconds)) -}}
{{- end -}}
{{- $accounting := .Values.accounting -}}
{{- if $accounting.enabled -}}
{{- $domain := printf "%s.svc.%s" .Release.Namespace .Values.clusterDomain -}}
{{- $db := $accounting.database -}}
{{- $_ := set $spec "accounting" (dict
  "host" (printf "%s-slurmdbd.%s" .Release.Name $domain)
  "port" (int $accounting.slurmdbd.port)
  "defaultAccount" $accounting.defaultAccount
  "groupAccounts" $accounting.groupAccounts
  "database" (dict
    "host" ($db.host | default (printf "%s-mariadb.%s" .Release.Name $domain))
    "port" (int $db.port)
    "name" $db.name
    "user" $db.user
    "tls" $db.tls.enabled)
) -}}
{{- end -}}
{{- $ldap := .Values.ldap -}}
{{- if or $ldap.enabled $ldap.dev.enabled -}}
{{- $suffix := $ldap.dev.suffix -}}
{{- $dev := $ldap.dev.enabled -}}
{{- $settings := dict
  "uris" ($ldap.uris | default (ternary (list (printf "ldap://%s-ldap" .Release.Name)) list $dev))
  "userBase" ($ldap.userBase | default (ternary (printf "ou=people,%s" $suffix) "" $dev))
  "groupBase" ($ldap.groupBase | default (ternary (printf "ou=groups,%s" $suffix) "" $dev))
  "userFilter" $ldap.userFilter
  "groupFilter" $ldap.groupFilter
  "attributes" $ldap.attributes
  "tls" $ldap.tls
  "timeoutSeconds" $ldap.timeoutSeconds
  "syncIntervalSeconds" (int $ldap.syncIntervalSeconds)
  "maxRemovalPercent" (int $ldap.maxRemovalPercent)
-}}
{{- with $ldap.bindDN }}{{ $_ := set $settings "bindDN" . }}{{ end -}}
{{- with $ldap.pageSize }}{{ $_ := set $settings "pageSize" (int .) }}{{ end -}}
{{- if $ldap.bindPasswordSecret }}{{ $_ := set $settings "bindPasswordFile" "/var/run/secrets/slonk/ldap-bind/password" }}{{ end -}}
{{- if $ldap.caSecret }}{{ $_ := set $settings "caFile" "/var/run/secrets/slonk/ldap-ca/ca.crt" }}{{ end -}}
{{- $_ := set $spec "ldap" $settings -}}
{{- end -}}
{{- $hooks := .Values.hooks -}}
{{- if $hooks.enabled -}}
{{- $_ := set $spec "hooks" (dict "link" "hooks" "prolog" $hooks.prolog "epilog" $hooks.epilog "taskProlog" $hooks.taskProlog "taskEpilog" $hooks.taskEpilog "timeoutSeconds" (int $hooks.timeoutSeconds) "phaseTimeoutSeconds" (int $hooks.phaseTimeoutSeconds) "maxFileBytes" (int $hooks.maxFileBytes)) -}}
{{- end -}}
{{- if $ldap.dev.enabled -}}
{{- $_ := set $spec "ldapServer" (dict "suffix" $ldap.dev.suffix "users" $ldap.dev.users "groups" $ldap.dev.groups) -}}
{{- end -}}
{{ toYaml $spec }}
{{- end }}

{{/* The git-sync sidecar that publishes the hooks repository into the shared volume. */}}
{{- define "slonk.gitSync" -}}
{{- $git := .Values.hooks.git }}
- name: git-sync
  image: {{ $git.image }}
  env:
    - {name: GITSYNC_REPO, value: {{ $git.repo | quote }}}
    - {name: GITSYNC_REF, value: {{ $git.ref | quote }}}
    - {name: GITSYNC_PERIOD, value: "{{ $git.periodSeconds }}s"}
    - {name: GITSYNC_DEPTH, value: {{ $git.depth | quote }}}
    - {name: GITSYNC_ROOT, value: /var/lib/slonk/git}
    - {name: GITSYNC_LINK, value: hooks}
    {{- with $git.credentialsSecret }}
    - name: GITSYNC_USERNAME
      valueFrom: {secretKeyRef: {name: {{ . }}, key: username}}
    - {name: GITSYNC_PASSWORD_FILE, value: /var/run/secrets/slonk/git/password}
    {{- end }}
  resources: {{- toYaml $git.resources | nindent 4 }}
  securityContext: {runAsUser: 65533, runAsGroup: 65533, allowPrivilegeEscalation: false}
  volumeMounts:
    - {name: hooks, mountPath: /var/lib/slonk/git}
    {{- if $git.credentialsSecret }}
    - {name: git-credentials, mountPath: /var/run/secrets/slonk/git, readOnly: true}
    {{- end }}
{{- end }}

{{/*
Labels of a StatefulSet's volumeClaimTemplates. A StatefulSet's volumeClaimTemplates cannot
change (Kubernetes refuses the update, and `helm upgrade` with it), so these are frozen at what
chart 0.1.0 rendered: never derive them from the chart's or the app's version.
Call with (dict "root" $ "component" "controller").
*/}}
{{- define "slonk.claimLabels" -}}
{{ include "slonk.selectorLabels" .root }}
app.kubernetes.io/version: "0.1.0"
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: slonk
helm.sh/chart: slonk-0.1.0
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
Checks on the network and pod security values that the schema cannot express; each failure
names the values key. Included by networkpolicy.yaml, which is always rendered.
*/}}
{{- define "slonk.validateSecurity" -}}
{{- $service := .Values.login.service -}}
{{- if and $service.loadBalancerSourceRanges (ne $service.type "LoadBalancer") -}}
{{- fail (printf "login.service.loadBalancerSourceRanges: only a LoadBalancer enforces them (login.service.type is %s); remove them or restrict ssh with networkPolicy.login.sshFrom" $service.type) -}}
{{- end -}}
{{- $range := index (.Values.slurm.slurmConf | default dict) "SrunPortRange" -}}
{{- if not (kindIs "invalid" $range) -}}
{{- $ports := splitList "-" (toString $range) -}}
{{- if not (regexMatch "^[0-9]{1,5}-[0-9]{1,5}$" (toString $range)) -}}
{{- fail (printf "slurm.slurmConf.SrunPortRange: %q must be FIRST-LAST (ports)" (toString $range)) -}}
{{- else if or (lt (index $ports 0 | int) 1024) (gt (index $ports 1 | int) 65535) (gt (index $ports 0 | int) (index $ports 1 | int)) -}}
{{- fail (printf "slurm.slurmConf.SrunPortRange: %q must be FIRST-LAST with 1024 <= FIRST <= LAST <= 65535" (toString $range)) -}}
{{- end -}}
{{- end -}}
{{- /* What every slonk container that drops ALL must keep (values.yaml says why). */ -}}
{{- $lists := dict -}}
{{- if not .Values.workers.privileged -}}
{{- $_ := set $lists "workers.capabilities" .Values.workers.capabilities -}}
{{- end -}}
{{- range $component := list "controller" "login" -}}
{{- $caps := (index $.Values $component).securityContext.capabilities | default dict -}}
{{- if has "ALL" ($caps.drop | default list) -}}
{{- $_ := set $lists (printf "%s.securityContext.capabilities.add" $component) ($caps.add | default list) -}}
{{- end -}}
{{- end -}}
{{- range $key, $caps := $lists -}}
{{- range $cap := list "CHOWN" "DAC_OVERRIDE" "FOWNER" "KILL" "SETGID" "SETUID" -}}
{{- if not (has $cap $caps) -}}
{{- fail (printf "%s: %s is missing; every other capability is dropped, and slonk's init and its daemons need it (see values.yaml)" $key $cap) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}

{{- /* The worker container's capabilities: workers.capabilities, and with workers.ssh what
sshd and pam_slurm_adopt need beyond them (values.yaml workers.ssh says why), as a YAML list. */}}
{{- define "slonk.workerCapabilities" -}}
{{- $caps := .Values.workers.capabilities -}}
{{- if .Values.workers.ssh.enabled -}}
{{- $caps = concat $caps (list "AUDIT_WRITE" "NET_BIND_SERVICE" "SYS_CHROOT" "SYS_PTRACE") | uniq -}}
{{- end -}}
{{ toYaml $caps }}
{{- end }}

{{/* An appArmorProfile as the pod annotation's value. */}}
{{- define "slonk.appArmorAnnotation" -}}
{{- if eq .type "Unconfined" }}unconfined{{ else if eq .type "RuntimeDefault" }}runtime/default{{ else }}localhost/{{ .localhostProfile }}{{ end -}}
{{- end }}

{{/* A login or worker pod's securityContext: the values' own and, where SrunPortRange is set,
that range reserved from the kernel's own choice of ports (net.ipv4.ip_local_reserved_ports, a
sysctl every Kubernetes since 1.27 allows): no connection of anyone's takes a port srun listens
on. With slurm.capTimeWait, the pod's sockets in TIME_WAIT are capped at half the range
(net.ipv4.tcp_max_tw_buckets, a sysctl kubelets must be told to allow): closed connections
never hold more than half of srun's ports. A sysctl the values set themselves is kept as it is.
Call with (dict "root" $ "context" PODSECURITYCONTEXT); nothing when the result is empty. */}}
{{- define "slonk.srunPodSecurityContext" -}}
{{- $context := deepCopy (.context | default dict) -}}
{{- $range := index (.root.Values.slurm.slurmConf | default dict) "SrunPortRange" -}}
{{- if not (kindIs "invalid" $range) -}}
{{- $sysctls := $context.sysctls | default list -}}
{{- $names := list -}}
{{- range $sysctls }}{{ $names = append $names (.name | replace "/" ".") }}{{ end -}}
{{- if not (has "net.ipv4.ip_local_reserved_ports" $names) -}}
{{- $sysctls = append $sysctls (dict "name" "net.ipv4.ip_local_reserved_ports" "value" (toString $range)) -}}
{{- end -}}
{{- if and .root.Values.slurm.capTimeWait (not (has "net.ipv4.tcp_max_tw_buckets" $names)) -}}
{{- $ports := splitList "-" (toString $range) -}}
{{- $half := div (add1 (sub (index $ports 1 | int) (index $ports 0 | int))) 2 -}}
{{- $sysctls = append $sysctls (dict "name" "net.ipv4.tcp_max_tw_buckets" "value" (toString $half)) -}}
{{- end -}}
{{- with $sysctls }}{{ $_ := set $context "sysctls" . }}{{ end -}}
{{- end -}}
{{- with $context }}securityContext: {{- toYaml . | nindent 2 }}{{ end -}}
{{- end }}

{{/* SrunPortRange as a NetworkPolicy port, or nothing when srun listens on ephemeral ports. */}}
{{- define "slonk.srunPorts" -}}
{{- $range := index (.Values.slurm.slurmConf | default dict) "SrunPortRange" -}}
{{- if not (kindIs "invalid" $range) -}}
{{- $ports := splitList "-" (toString $range) -}}
ports:
  - {protocol: TCP, port: {{ index $ports 0 | int }}, endPort: {{ index $ports 1 | int }}}
{{- end -}}
{{- end }}

{{/* A NetworkPolicy peer: this release's pods of the given components.
Call with (dict "root" $ "components" (list "controller" "worker")). */}}
{{- define "slonk.peerPods" -}}
podSelector:
  matchLabels: {{- include "slonk.selectorLabels" .root | nindent 4 }}
  matchExpressions:
    - {key: app.kubernetes.io/component, operator: In, values: {{ toJson .components }}}
{{- end }}

{{/* The TCP ports of ldap.uris (389 for ldap://, 636 for ldaps://, unless given), as a list. */}}
{{- define "slonk.ldapPorts" -}}
{{- $ports := list -}}
{{- range $i, $uri := .Values.ldap.uris -}}
{{- $port := ternary 636 389 (hasPrefix "ldaps://" $uri) -}}
{{- $hostPort := regexReplaceAll "^ldaps?://([^/?]*).*$" $uri "${1}" -}}
{{- with regexFind ":[0-9]+$" $hostPort }}{{ $port = trimPrefix ":" . | int }}{{ end -}}
{{- if or (lt $port 1) (gt $port 65535) -}}
{{- fail (printf "ldap.uris[%d]: %q: port %d is not a TCP port" $i $uri $port) -}}
{{- end -}}
{{- $ports = append $ports $port -}}
{{- end -}}
{{ toJson (uniq $ports) }}
{{- end }}

{{/* A NetworkPolicy egress rule: DNS queries, to networkPolicy.dnsTo or anywhere. */}}
{{- define "slonk.dnsEgress" -}}
- ports:
    - {protocol: UDP, port: 53}
    - {protocol: TCP, port: 53}
  {{- with .Values.networkPolicy.dnsTo }}
  to: {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* Metrics (values: metrics): slonk's exporter on the controller and every worker. The
container port and the NetworkPolicy rule, each nothing when it is off. */}}
{{- define "slonk.metricsContainerPort" -}}
{{- if .Values.metrics.enabled -}}
- {name: metrics, containerPort: {{ .Values.metrics.port }}}
{{- end -}}
{{- end }}

{{- define "slonk.metricsIngress" -}}
{{- if .Values.metrics.enabled -}}
# Scrapes of slonk's exporter: from networkPolicy.metricsFrom, or anyone.
- ports:
    - {protocol: TCP, port: {{ .Values.metrics.port }}}
  {{- with .Values.networkPolicy.metricsFrom }}
  from: {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
{{- end }}

{{- /* metrics.port must be free in the pods the exporter runs in: not slurmctld's (the
controller), slurmd's or sshd's (the workers, with workers.ssh; refused whatever it says, as
the pods' parser does). The same rule and words as slonk.config.spec. */}}
{{- define "slonk.validateMetrics" -}}
{{- if .Values.metrics.enabled -}}
{{- $port := int .Values.metrics.port -}}
{{- $owners := list (list "slurmctldPort" (int .Values.slurm.slurmctldPort)) (list "slurmdPort" (int .Values.slurm.slurmdPort)) (list "sshd" 22) -}}
{{- range $owner := $owners -}}
{{- if eq $port (index $owner 1) -}}
{{- fail (printf "metrics.port: %d is %s's port, in the same pods" $port (index $owner 0)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* A site's labels (list: root context, their values key, the labels) after the chart's own,
which they may not repeat: a duplicate key would silently win or be refused by the API. */}}
{{- define "slonk.extraLabels" -}}
{{- $root := index . 0 -}}{{- $key := index . 1 -}}{{- $labels := index . 2 | default dict -}}
{{- $own := include "slonk.labels" $root | fromYaml -}}
{{- range $name, $value := $labels -}}
{{- if hasKey $own $name -}}
{{- fail (printf "%s: %s is set by the chart" $key $name) -}}
{{- end -}}
{{- end -}}
{{- with $labels }}{{ toYaml . }}{{ end -}}
{{- end }}
