{{/*
ragtoll chart helpers: names, labels, the effective ragtoll config, and the settings handed to the
ragtoll-sidecar library templates (one container definition for both modes).
*/}}

{{- define "ragtoll.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified name. Truncated to 52 characters (not 63) because "-jaeger", "-redis" and the
StatefulSet's controller-revision-hash label suffix must still fit the 63-character limit.
*/}}
{{- define "ragtoll.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ragtoll.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ragtoll.namespace" -}}
{{- .Release.Namespace }}
{{- end }}

{{- define "ragtoll.labels" -}}
helm.sh/chart: {{ include "ragtoll.chart" . }}
{{ include "ragtoll.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "ragtoll.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ragtoll.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ .Values.mode }}
{{- end }}

{{/* Labels of a satellite component (redis, jaeger): call with (list $ "redis"). */}}
{{- define "ragtoll.componentLabels" -}}
{{- $root := index . 0 -}}
helm.sh/chart: {{ include "ragtoll.chart" $root }}
{{ include "ragtoll.componentSelectorLabels" . }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
{{- end }}

{{- define "ragtoll.componentSelectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "ragtoll.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "ragtoll.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ragtoll.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ragtoll.configName" -}}
{{- if .Values.configMap.create }}
{{- include "ragtoll.fullname" . }}
{{- else }}
{{- .Values.configMap.existingName }}
{{- end }}
{{- end }}

{{- define "ragtoll.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end }}

{{- define "ragtoll.redisHost" -}}
{{- printf "%s-redis" (include "ragtoll.fullname" .) -}}
{{- end }}

{{- define "ragtoll.jaegerHost" -}}
{{- printf "%s-jaeger" (include "ragtoll.fullname" .) -}}
{{- end }}

{{/*
The effective ragtoll config as YAML: `config:` with the few keys the chart must know filled in
when unset (server.port, server.host, server.metrics_port/metrics_host with metrics.enabled,
store for the built-in Redis, jwks_file for a JWKS secret).
*/}}
{{- define "ragtoll.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) -}}
{{- $server := deepCopy (get $cfg "server" | default dict) -}}
{{- if not (hasKey $server "port") -}}
{{- $_ := set $server "port" 8787 -}}
{{- end -}}
{{- if not (hasKey $server "host") -}}
{{- $_ := set $server "host" (ternary "0.0.0.0" "127.0.0.1" (eq .Values.mode "gateway")) -}}
{{- end -}}
{{- if and .Values.metrics.enabled (not (hasKey $server "metrics_port")) -}}
{{- $_ := set $server "metrics_port" (.Values.metrics.port | int) -}}
{{- end -}}
{{- if and (hasKey $server "metrics_port") (not (hasKey $server "metrics_host")) -}}
{{- $_ := set $server "metrics_host" "0.0.0.0" -}}
{{- end -}}
{{- $_ := set $cfg "server" $server -}}
{{- if and .Values.redis.enabled (eq (get $cfg "store" | default "memory") "memory") -}}
{{- $_ := set $cfg "store" (printf "redis://%s:6379/0" (include "ragtoll.redisHost" .)) -}}
{{- end -}}
{{- if .Values.secrets.jwks.existingSecret -}}
{{- $identity := deepCopy (get $cfg "identity" | default dict) -}}
{{- $jwt := deepCopy (get $identity "jwt" | default dict) -}}
{{- if not (get $jwt "jwks_file") -}}
{{- $_ := set $jwt "jwks_file" (printf "%s/%s" (include "ragtoll-sidecar.jwksDir" .) .Values.secrets.jwks.key) -}}
{{- end -}}
{{- $_ := set $identity "jwt" $jwt -}}
{{- $_ := set $cfg "identity" $identity -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end }}

{{- define "ragtoll.port" -}}
{{- $cfg := include "ragtoll.config" . | fromYaml -}}
{{- $cfg.server.port | int -}}
{{- end }}

{{/* The metrics listener's port (server.metrics_port), or 0 when there is none. */}}
{{- define "ragtoll.metricsPort" -}}
{{- $cfg := include "ragtoll.config" . | fromYaml -}}
{{- $cfg.server.metrics_port | default 0 | int -}}
{{- end }}

{{- define "ragtoll.host" -}}
{{- $cfg := include "ragtoll.config" . | fromYaml -}}
{{- $cfg.server.host -}}
{{- end }}

{{/* The store ragtoll will use: RAGTOLL_STORE from externalRedis wins over the config file. */}}
{{- define "ragtoll.effectiveStore" -}}
{{- if .Values.externalRedis.existingSecret -}}
secret
{{- else if .Values.externalRedis.url -}}
{{- .Values.externalRedis.url -}}
{{- else -}}
{{- $cfg := include "ragtoll.config" . | fromYaml -}}
{{- $cfg.store | default "memory" -}}
{{- end -}}
{{- end }}

{{/* OTLP endpoint for ragtoll and the agent: otel.endpoint, else the built-in Jaeger, else none. */}}
{{- define "ragtoll.otelEndpoint" -}}
{{- if .Values.otel.endpoint -}}
{{- .Values.otel.endpoint -}}
{{- else if .Values.jaeger.enabled -}}
{{- $port := ternary 4317 4318 (eq .Values.otel.protocol "grpc") -}}
{{- printf "http://%s.%s.svc:%d" (include "ragtoll.jaegerHost" .) (include "ragtoll.namespace" .) $port -}}
{{- end -}}
{{- end }}

{{- define "ragtoll.configChecksum" -}}
{{- include "ragtoll.config" . | sha256sum -}}
{{- end }}

{{/* The settings dict for the ragtoll-sidecar library templates, as YAML (use with fromYaml). */}}
{{- define "ragtoll.sidecarSettings" -}}
{{- $secretEnv := list -}}
{{- $cfg := .Values.config | default dict -}}
{{- $admin := get $cfg "admin" | default dict -}}
{{- $identity := get $cfg "identity" | default dict -}}
{{- $jwt := get $identity "jwt" | default dict -}}
{{- $budgets := get $cfg "budgets" | default dict -}}
{{- with .Values.secrets.adminToken.existingSecret -}}
{{- $secretEnv = append $secretEnv (dict "name" (get $admin "token_env" | default "RAGTOLL_ADMIN_TOKEN") "secretName" . "key" $.Values.secrets.adminToken.key) -}}
{{- end -}}
{{- with .Values.secrets.jwtSecret.existingSecret -}}
{{- $secretEnv = append $secretEnv (dict "name" (get $jwt "secret_env" | default "RAGTOLL_JWT_SECRET") "secretName" . "key" $.Values.secrets.jwtSecret.key) -}}
{{- end -}}
{{- with .Values.secrets.budgetHmacKey.existingSecret -}}
{{- $secretEnv = append $secretEnv (dict "name" (get $budgets "hmac_key_env" | default "RAGTOLL_BUDGET_HMAC_KEY") "secretName" . "key" $.Values.secrets.budgetHmacKey.key) -}}
{{- end -}}
{{- with .Values.externalRedis.existingSecret -}}
{{- $secretEnv = append $secretEnv (dict "name" "RAGTOLL_STORE" "secretName" . "key" $.Values.externalRedis.key) -}}
{{- end -}}
{{- $env := list -}}
{{- if and .Values.externalRedis.url (not .Values.externalRedis.existingSecret) -}}
{{- $env = append $env (dict "name" "RAGTOLL_STORE" "value" .Values.externalRedis.url) -}}
{{- end -}}
{{- $env = concat $env .Values.extraEnv -}}
{{- $gateway := eq .Values.mode "gateway" -}}
native: {{ and (not $gateway) .Values.sidecar.native }}
waitForReady: {{ not $gateway }}
image: {{ include "ragtoll.image" . | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
port: {{ include "ragtoll.port" . }}
host: {{ include "ragtoll.host" . | quote }}
metricsPort: {{ include "ragtoll.metricsPort" . }}
configMapName: {{ include "ragtoll.configName" . | quote }}
secretEnv: {{ toYaml $secretEnv | nindent 2 }}
env: {{ toYaml $env | nindent 2 }}
envFrom: {{ toYaml .Values.envFrom | nindent 2 }}
jwks:
  secretName: {{ .Values.secrets.jwks.existingSecret | quote }}
otel:
  endpoint: {{ include "ragtoll.otelEndpoint" . | quote }}
  protocol: {{ .Values.otel.protocol | quote }}
  serviceName: {{ .Values.otel.serviceName | default (include "ragtoll.fullname" .) | quote }}
resources: {{ toYaml .Values.resources | nindent 2 }}
securityContext: {{ toYaml .Values.securityContext | nindent 2 }}
probes: {{ toYaml .Values.probes | nindent 2 }}
volumeMounts: {{ toYaml .Values.extraVolumeMounts | nindent 2 }}
records:
  maxBytes: {{ get $budgets "records_max_bytes" | default 16777216 | int64 }}
  keep: {{ get $budgets "records_keep" | default 3 | int64 }}
{{- end }}
