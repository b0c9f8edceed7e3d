{{/*
What the schema cannot say of static users and groups and the development directory's:
ids within `accounts`' range, names and ids unique, a user's groups declared beside it (the
schema holds the rest of slonk.config.accounts' rules: names, paths, keys, reserved ids).
The pods' spec parser refuses the same values; each message is its own, naming the values
key (ldap.dev.* is ldapServer.* in cluster.yaml), so a chart that renders never leaves every
pod refusing its cluster.yaml.
*/}}
{{- define "slonk.validateAccounts" -}}
{{- $min := int .Values.accounts.minId -}}
{{- $max := int .Values.accounts.maxId -}}
{{- if gt $min $max -}}
{{- fail (printf "accounts.maxId: must be >= %d, got %d" $min $max) -}}
{{- end -}}
{{- include "slonk.validateAccountSet" (dict "at" "" "users" .Values.users "groups" .Values.groups "min" $min "max" $max) -}}
{{- include "slonk.validateAccountSet" (dict "at" "ldap.dev." "users" .Values.ldap.dev.users "groups" .Values.ldap.dev.groups "min" $min "max" $max) -}}
{{- end }}

{{/* One set of users and groups, checked in the order of spec.py's _accounts. */}}
{{- define "slonk.validateAccountSet" -}}
{{- $at := .at -}}
{{- $min := .min -}}
{{- $max := .max -}}
{{- range $i, $group := .groups -}}
{{- include "slonk.validateAccountId" (dict "key" (printf "%sgroups[%d].gid" $at $i) "what" "gid" "id" $group.gid "min" $min "max" $max) -}}
{{- end -}}
{{- $names := dict -}}
{{- range $i, $group := .groups -}}
{{- if hasKey $names $group.name -}}
{{- fail (printf "%sgroups[%d].name: duplicate group '%s'" $at $i $group.name) -}}
{{- end -}}
{{- $_ := set $names $group.name true -}}
{{- end -}}
{{- $gids := dict -}}
{{- range $i, $group := .groups -}}
{{- $gid := toString (int $group.gid) -}}
{{- if hasKey $gids $gid -}}
{{- fail (printf "%sgroups[%d].gid: duplicate gid %s" $at $i $gid) -}}
{{- end -}}
{{- $_ := set $gids $gid true -}}
{{- end -}}
{{- range $i, $user := .users -}}
{{- range $j, $group := ($user.groups | default list) -}}
{{- if not (hasKey $names $group) -}}
{{- fail (printf "%susers[%d].groups[%d]: unknown group '%s': declare it in groups" $at $i $j $group) -}}
{{- end -}}
{{- end -}}
{{- range $field := list "uid" "gid" -}}
{{- include "slonk.validateAccountId" (dict "key" (printf "%susers[%d].%s" $at $i $field) "what" $field "id" (index $user $field) "min" $min "max" $max) -}}
{{- end -}}
{{- end -}}
{{- $users := dict -}}
{{- range $i, $user := .users -}}
{{- if hasKey $users $user.name -}}
{{- fail (printf "%susers[%d].name: duplicate user '%s'" $at $i $user.name) -}}
{{- end -}}
{{- $_ := set $users $user.name true -}}
{{- end -}}
{{- $uids := dict -}}
{{- range $i, $user := .users -}}
{{- $uid := toString (int $user.uid) -}}
{{- if hasKey $uids $uid -}}
{{- fail (printf "%susers[%d].uid: duplicate uid %s" $at $i $uid) -}}
{{- end -}}
{{- $_ := set $uids $uid true -}}
{{- end -}}
{{- end }}

{{- define "slonk.validateAccountId" -}}
{{- $id := int .id -}}
{{- if or (lt $id (int .min)) (gt $id (int .max)) -}}
{{- fail (printf "%s: %s %d is outside %d-%d" .key .what $id (int .min) (int .max)) -}}
{{- end -}}
{{- end }}

{{/* accounting.groupAccounts: each group mapped once (the pods refuse a second mapping). */}}
{{- define "slonk.validateGroupAccounts" -}}
{{- $groups := dict -}}
{{- range $i, $mapping := .Values.accounting.groupAccounts -}}
{{- if hasKey $groups $mapping.group -}}
{{- fail (printf "accounting.groupAccounts[%d].group: duplicate group '%s'" $i $mapping.group) -}}
{{- end -}}
{{- $_ := set $groups $mapping.group true -}}
{{- end -}}
{{- end -}}

{{/* accounting.database: never MariaDB's own schemas or accounts (spec.RESERVED_DATABASE*). */}}
{{- define "slonk.validateDatabase" -}}
{{- $db := .Values.accounting.database -}}
{{- if has (lower $db.name) (list "mysql" "sys" "performance_schema" "information_schema") -}}
{{- fail (printf "accounting.database.name: %q is MariaDB's own: slurmdbd's account would rule the server" $db.name) -}}
{{- end -}}
{{- if has (lower $db.user) (list "root" "mysql" "public") -}}
{{- fail (printf "accounting.database.user: %q is MariaDB's own: slurmdbd's account would rule the server" $db.user) -}}
{{- end -}}
{{- end -}}
