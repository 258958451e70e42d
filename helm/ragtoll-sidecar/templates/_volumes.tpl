{{/*
ragtoll-sidecar: the volumes ragtoll needs and where it mounts them.

"ragtoll-sidecar.volumes" is list items for the pod's `volumes:`; call it with the same settings
dict as the container plus `configMapName` (the ConfigMap holding ragtoll.yaml).
*/}}
{{- define "ragtoll-sidecar.volumes" -}}
- name: ragtoll-config
  configMap:
    name: {{ required "ragtoll-sidecar: v.configMapName (the ConfigMap with ragtoll.yaml) is required" .configMapName | quote }}
# The root filesystem is read-only; Python and tiktoken may want a scratch directory.
- name: ragtoll-tmp
  emptyDir:
    sizeLimit: 64Mi
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

{{/* Where a JWKS secret is mounted; point identity.jwt.jwks_file at <this>/<key>. */}}
{{- define "ragtoll-sidecar.jwksDir" -}}
/var/run/secrets/ragtoll/jwks
{{- end -}}
