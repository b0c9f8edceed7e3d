{{/*
The id range of `accounts` over static users and groups and the development directory's
(the schema holds the rest of slonk.config.accounts' rules: names, paths, keys, reserved
ids). Messages are slonk's own, naming the values key.
*/}}
{{- define "slonk.validateAccounts" -}}
{{- $min := int .Values.accounts.minId -}}
{{- $max := int .Values.accounts.maxId -}}
{{- if gt $min $max -}}
{{- fail (printf "accounts.maxId: must be >= %d, got %d" $min $max) -}}
{{- end -}}
{{- $lists := list
  (list "users" .Values.users (list "uid" "gid"))
  (list "groups" .Values.groups (list "gid"))
  (list "ldap.dev.users" .Values.ldap.dev.users (list "uid" "gid"))
  (list "ldap.dev.groups" .Values.ldap.dev.groups (list "gid")) -}}
{{- range $list := $lists -}}
{{- $key := index $list 0 -}}
{{- range $i, $account := index $list 1 -}}
{{- range $field := index $list 2 -}}
{{- $id := int (index $account $field) -}}
{{- if or (lt $id $min) (gt $id $max) -}}
{{- fail (printf "%s[%d].%s: %s %d is outside %d-%d" $key $i $field $field $id $min $max) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}
