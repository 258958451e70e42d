{{/*
ragtoll-sidecar.fail: refuse contradictory values with a message, under `helm template/install`
AND under `helm lint`. Call with the message: {{ include "ragtoll-sidecar.fail" "[ERROR] ..." }}.

Helm makes `fail` a no-op while linting (helm/helm#8973, by design), so a chart whose checks only
call `fail` lints clean with values it refuses to install. Past the `fail`, which only lint
reaches, the message is included as a template name that no chart defines: an execution error
that lint does report. The name wraps the message in the delimiters Helm's engine puts around a
`fail` message (HELM_ERR_START/HELM_ERR_END, spelled in pieces so the template's own source,
which the error quotes, holds no delimiter), so the engine cleans the error up as it does a
`fail`'s: lint and install print the same one line, `execution error at (<file>): [ERROR] ...`
(tests/helm/test_chart_render.py checks both).
*/}}
{{- define "ragtoll-sidecar.fail" -}}
{{- fail . -}}
{{- include (printf "%s_START%s%s_END" "HELM_ERR" . "HELM_ERR") nil -}}
{{- end -}}
