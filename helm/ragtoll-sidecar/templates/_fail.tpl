{{/*
ragtoll-sidecar.fail: refuse contradictory values with a message, under `helm template/install`
AND under `helm lint`. Call with the message: {{ include "ragtoll-sidecar.fail" "[ERROR] ..." }}.

Helm makes `fail` a no-op while linting (helm/helm#8973, by design), so a chart whose checks only
call `fail` lints clean with values it refuses to install. Past the `fail`, which only lint
reaches, the message is included as a template name that no chart defines: an execution error
that lint does report, and whose text carries the message.
*/}}
{{- define "ragtoll-sidecar.fail" -}}
{{- fail . -}}
{{- include . nil -}}
{{- end -}}
