{{/*
ragtoll-sidecar: environment variables, for ragtoll itself and for the agent next to it.
*/}}

{{/*
ragtoll's own env (called with the settings dict v): pod identity for OTel resource attributes,
the OTEL_* exporter settings, secrets by reference (v.secretEnv: [{name, secretName, key}]), v.env.
*/}}
{{- define "ragtoll-sidecar.ragtollEnv" -}}
{{- $otel := .otel | default dict -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
# The root filesystem is read-only: task records (JSONL sink, memory store) go to the /tmp emptyDir.
# Like every RAGTOLL_* variable this overrides the config file; change it with `env`/extraEnv.
- name: RAGTOLL_BUDGETS__RECORDS_FILE
  value: "/tmp/ragtoll-tasks.jsonl"
- name: OTEL_SERVICE_NAME
  value: {{ $otel.serviceName | default "ragtoll" | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE)"
{{- if $otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $otel.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $otel.protocol | default "http/protobuf" | quote }}
{{- end }}
{{- range .secretEnv }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName | quote }}
      key: {{ .key | quote }}
{{- end }}
{{- with .env }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The agent's env, pointing its SDKs at ragtoll. Called with a dict:
  upstreams      the `upstreams` list of ragtoll's config (name, api, prefix); empty = ragtoll's
                 built-in default route /openai
  port           ragtoll's port (default 8787)
  baseUrl        default http://127.0.0.1:<port> (the sidecar); a gateway passes its Service URL
  envFromRoutes  {upstream name: ENV_VAR} extra variables holding that route's URL
  otel           {endpoint, protocol} for the agent's own OTel SDK, if it has one
  serviceName    OTEL_SERVICE_NAME for the agent (omitted when empty)
  skip           names the caller sets itself (the agent's explicit env wins)
Per route: the first `api: openai` route sets OPENAI_BASE_URL=<route>/v1, the first
`api: anthropic` route sets ANTHROPIC_BASE_URL=<route>, and every route sets
RAGTOLL_<NAME>_URL=<route> (name upper-cased, '-' as '_').
*/}}
{{- define "ragtoll-sidecar.agentEnv" -}}
{{- $port := .port | default 8787 | int -}}
{{- $base := .baseUrl | default (printf "http://127.0.0.1:%d" $port) | trimSuffix "/" -}}
{{- $upstreams := .upstreams | default (list (dict "name" "openai" "api" "openai" "prefix" "/openai")) -}}
{{- $skip := .skip | default list -}}
{{- $vars := list -}}
{{- $routes := dict -}}
{{- $first := dict -}}
{{- range $upstreams -}}
{{- $url := printf "%s%s" $base (.prefix | default (printf "/%s" .name)) -}}
{{- $_ := set $routes .name $url -}}
{{- if and (eq (.api | default "") "openai") (not (hasKey $first "openai")) -}}
{{- $_ := set $first "openai" true -}}
{{- $vars = append $vars (dict "name" "OPENAI_BASE_URL" "value" (printf "%s/v1" $url)) -}}
{{- end -}}
{{- if and (eq (.api | default "") "anthropic") (not (hasKey $first "anthropic")) -}}
{{- $_ := set $first "anthropic" true -}}
{{- $vars = append $vars (dict "name" "ANTHROPIC_BASE_URL" "value" $url) -}}
{{- end -}}
{{- $vars = append $vars (dict "name" (printf "RAGTOLL_%s_URL" (.name | upper | replace "-" "_")) "value" $url) -}}
{{- end -}}
{{- range $route, $var := .envFromRoutes -}}
{{- if not (hasKey $routes $route) -}}
{{- include "ragtoll-sidecar.fail" (printf "[ERROR] agent.envFromRoutes names upstream '%s', which is not in config.upstreams (%s). Fix the name or add the upstream." $route (keys $routes | sortAlpha | join ", ")) -}}
{{- end -}}
{{- $vars = append $vars (dict "name" $var "value" (get $routes $route)) -}}
{{- end -}}
{{- $otel := .otel | default dict -}}
{{- if $otel.endpoint -}}
{{- $vars = append $vars (dict "name" "OTEL_EXPORTER_OTLP_ENDPOINT" "value" $otel.endpoint) -}}
{{- $vars = append $vars (dict "name" "OTEL_EXPORTER_OTLP_PROTOCOL" "value" ($otel.protocol | default "http/protobuf")) -}}
{{- end -}}
{{- /* W3C trace context + baggage: how ragtoll finds the agent's task without code changes. */ -}}
{{- $vars = append $vars (dict "name" "OTEL_PROPAGATORS" "value" "tracecontext,baggage") -}}
{{- with .serviceName -}}
{{- $vars = append $vars (dict "name" "OTEL_SERVICE_NAME" "value" .) -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $vars -}}
{{- if not (or (has .name $skip) (hasKey $seen .name)) -}}
{{- $_ := set $seen .name true }}
- name: {{ .name }}
  value: {{ .value | quote }}
{{- end -}}
{{- end -}}
{{- end -}}
