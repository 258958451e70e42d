{{/*
ragtoll-sidecar: the volumes ragtoll needs and where it mounts them.

"ragtoll-sidecar.volumes" is list items for the pod's `volumes:`; call it with the same settings
dict as the container plus `configMapName` (the ConfigMap holding ragtoll.yaml).
*/}}
{{- define "ragtoll-sidecar.volumes" -}}
- name: ragtoll-config
  configMap:
    name: {{ required "ragtoll-sidecar: v.configMapName (the ConfigMap with ragtoll.yaml) is required" .configMapName | quote }}
# The root filesystem is read-only: task records and Python's scratch files go here.
- name: ragtoll-tmp
  emptyDir:
    sizeLimit: {{ include "ragtoll-sidecar.tmpSizeLimit" . }}
{{- $jwks := .jwks | default dict }}
{{- if $jwks.secretName }}
- name: ragtoll-jwks
  secret:
    secretName: {{ $jwks.secretName | quote }}
{{- end }}
{{- end -}}

{{- define "ragtoll-sidecar.volumeMounts" -}}
- name: ragtoll-config
  mountPath: /etc/ragtoll
  readOnly: true
- name: ragtoll-tmp
  mountPath: /tmp
{{- $jwks := .jwks | default dict }}
{{- if $jwks.secretName }}
- name: ragtoll-jwks
  mountPath: {{ include "ragtoll-sidecar.jwksDir" . }}
  readOnly: true
{{- end }}
{{- with .volumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The size limit of ragtoll's /tmp emptyDir, which holds the task records (RAGTOLL_BUDGETS__RECORDS_FILE):
the records file and its rotated files, (records.keep + 1) x records.maxBytes, rounded up to MiB,
plus 32Mi of scratch. The kubelet evicts a pod whose emptyDir outgrows its limit, so this follows
ragtoll's own rotation settings (budgets.records_max_bytes / records_keep; defaults 16 MiB and 3).
*/}}
{{- define "ragtoll-sidecar.tmpSizeLimit" -}}
{{- $records := .records | default dict -}}
{{- $maxBytes := $records.maxBytes | default 16777216 | int64 -}}
{{- $keep := $records.keep | default 3 | int64 -}}
{{- $mib := 1048576 -}}
{{- printf "%dMi" (add (div (add (mul (add $keep 1) $maxBytes) (sub $mib 1)) $mib) 32) -}}
{{- end -}}

{{/* Where a JWKS secret is mounted; point identity.jwt.jwks_file at <this>/<key>. */}}
{{- define "ragtoll-sidecar.jwksDir" -}}
/var/run/secrets/ragtoll/jwks
{{- end -}}
