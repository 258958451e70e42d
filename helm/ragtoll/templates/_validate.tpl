{{/*
Cross-field checks a schema cannot express. Contradictory values are refused with an
"[ERROR] ..." message that names the fix, by `helm template/install` and by `helm lint` alike
(ragtoll-sidecar.fail explains how). Included at the top of deployment.yaml, the one template
rendered in every mode.
*/}}
{{- define "ragtoll.validate" -}}
{{- $gateway := eq .Values.mode "gateway" -}}
{{- $port := include "ragtoll.port" . | int -}}
{{- $host := include "ragtoll.host" . -}}
{{- $store := include "ragtoll.effectiveStore" . -}}
{{- $cfgStore := .Values.config.store | default "memory" -}}
{{- if and (not $gateway) (not .Values.agent.image.repository) -}}
{{- include "ragtoll-sidecar.fail" "[ERROR] mode=sidecar renders your agent's Deployment and needs agent.image.repository (your agent's image). Set it, or use mode=gateway to run ragtoll alone." -}}
{{- end -}}
{{- if and .Values.redis.enabled (or .Values.externalRedis.url .Values.externalRedis.existingSecret (ne $cfgStore "memory")) -}}
{{- include "ragtoll-sidecar.fail" "[ERROR] redis.enabled starts a built-in Redis, but an external store is also set (externalRedis.url, externalRedis.existingSecret or config.store). Choose one: set redis.enabled=false to use the external one." -}}
{{- end -}}
{{- if and .Values.externalRedis.url .Values.externalRedis.existingSecret -}}
{{- include "ragtoll-sidecar.fail" "[ERROR] externalRedis.url and externalRedis.existingSecret are both set. Set only one (use the Secret when the URL holds a password)." -}}
{{- end -}}
{{- if and $gateway (eq $store "memory") (or (gt (int .Values.replicaCount) 1) .Values.autoscaling.enabled) -}}
{{- include "ragtoll-sidecar.fail" "[ERROR] mode=gateway with several replicas (replicaCount > 1 or autoscaling.enabled) needs a shared store, but the store is memory: each replica would count budgets on its own. Set redis.enabled=true, externalRedis.url / externalRedis.existingSecret, or config.store=redis://..., or run one replica." -}}
{{- end -}}
{{- if and $gateway (has $host (list "127.0.0.1" "localhost" "::1")) -}}
{{- include "ragtoll-sidecar.fail" (printf "[ERROR] mode=gateway needs ragtoll to accept connections from its Service, but config.server.host is %s. Remove config.server.host (the chart then uses 0.0.0.0)." $host) -}}
{{- end -}}
{{- if and .Values.jaeger.enabled .Values.otel.endpoint -}}
{{- include "ragtoll-sidecar.fail" "[ERROR] jaeger.enabled points OTLP export at the built-in Jaeger, but otel.endpoint is also set. Unset otel.endpoint, or set jaeger.enabled=false." -}}
{{- end -}}
{{- if and .Values.configMap.create .Values.configMap.existingName -}}
{{- include "ragtoll-sidecar.fail" "[ERROR] configMap.create=true and configMap.existingName are both set. Set configMap.create=false to use the existing ConfigMap, or drop existingName." -}}
{{- end -}}
{{- if and (not .Values.configMap.create) (not .Values.configMap.existingName) -}}
{{- include "ragtoll-sidecar.fail" "[ERROR] configMap.create=false needs configMap.existingName (a ConfigMap with a ragtoll.yaml key)." -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) -}}
{{- include "ragtoll-sidecar.fail" "[ERROR] autoscaling.minReplicas is greater than autoscaling.maxReplicas." -}}
{{- end -}}
{{- if and .Values.podDisruptionBudget.enabled (not (kindIs "invalid" .Values.podDisruptionBudget.minAvailable)) (not (kindIs "invalid" .Values.podDisruptionBudget.maxUnavailable)) -}}
{{- include "ragtoll-sidecar.fail" "[ERROR] podDisruptionBudget sets both minAvailable and maxUnavailable; Kubernetes accepts only one. Set the other to null." -}}
{{- end -}}
{{- $metricsPort := include "ragtoll.metricsPort" . | int -}}
{{- if and $metricsPort (eq $metricsPort $port) -}}
{{- include "ragtoll-sidecar.fail" (printf "[ERROR] metrics.port (server.metrics_port) is %d, the port ragtoll serves calls on (config.server.port). Choose another, e.g. 9464." $port) -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled (not $gateway) -}}
{{- include "ragtoll-sidecar.fail" "[ERROR] metrics.serviceMonitor needs mode=gateway: in sidecar mode ragtoll has no Service of its own. Use metrics.podMonitor.enabled=true with metrics.enabled=true instead." -}}
{{- end -}}
{{- if and .Values.metrics.podMonitor.enabled (not $gateway) (not $metricsPort) -}}
{{- include "ragtoll-sidecar.fail" "[ERROR] metrics.podMonitor in sidecar mode needs metrics.enabled=true: ragtoll listens on 127.0.0.1, where Prometheus cannot scrape it; metrics.enabled opens the metrics port on the pod's address." -}}
{{- end -}}
{{- if not $gateway -}}
{{- range .Values.agent.ports -}}
{{- if and $metricsPort (eq (int .containerPort) $metricsPort) -}}
{{- include "ragtoll-sidecar.fail" (printf "[ERROR] agent.ports '%s' uses port %d, which ragtoll's metrics listener uses in the same pod (metrics.port). Change one of them." .name $metricsPort) -}}
{{- end -}}
{{- if eq (int .containerPort) $port -}}
{{- include "ragtoll-sidecar.fail" (printf "[ERROR] agent.ports '%s' uses port %d, which ragtoll listens on in the same pod. Change the agent's port or config.server.port." .name $port) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}
