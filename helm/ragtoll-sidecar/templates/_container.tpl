{{/*
ragtoll-sidecar: the ragtoll container, as a native sidecar or a classic container.

Call with a dict: (dict "root" $ "v" $settings). $settings keys (see README.md):
  native, name, image, imagePullPolicy, port, host, metricsPort, configKey, args, env, envFrom, secretEnv,
  jwks, otel, resources, securityContext, probes, volumeMounts, waitForReady.
The result is ONE list item (starts with "- name:"); put it under `initContainers:` when
native is true (restartPolicy: Always makes it a sidecar, K8s >= 1.29) or under `containers:`
(first, so the postStart wait holds the next container back) when native is false.
*/}}
{{- define "ragtoll-sidecar.container" -}}
{{- $v := .v -}}
{{- $native := include "ragtoll-sidecar.native" $v | eq "true" -}}
{{- $port := $v.port | default 8787 | int -}}
- name: {{ $v.name | default "ragtoll" }}
  image: {{ required "ragtoll-sidecar: v.image (the ragtoll image reference) is required" $v.image | quote }}
  imagePullPolicy: {{ $v.imagePullPolicy | default "IfNotPresent" }}
  {{- if $native }}
  # A native sidecar: started before the app containers, kept running, stopped after them.
  restartPolicy: Always
  {{- end }}
  args:
    {{- if $v.args }}
    {{- toYaml $v.args | nindent 4 }}
    {{- else }}
    - serve
    - --config
    - /etc/ragtoll/{{ $v.configKey | default "ragtoll.yaml" }}
    {{- end }}
  ports:
    - name: ragtoll
      containerPort: {{ $port }}
      protocol: TCP
    {{- with $v.metricsPort }}
    # GET /metrics on the pod's address (server.metrics_port), for a PodMonitor or ServiceMonitor
    - name: metrics
      containerPort: {{ . | int }}
      protocol: TCP
    {{- end }}
  env:
    {{- include "ragtoll-sidecar.ragtollEnv" $v | nindent 4 }}
  {{- with $v.envFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- $probes := $v.probes | default dict }}
  {{- $startup := $probes.startup | default dict }}
  {{- $readiness := $probes.readiness | default dict }}
  {{- $liveness := $probes.liveness | default dict }}
  startupProbe:
    {{- include "ragtoll-sidecar.probeHandler" (dict "v" $v "path" "/readyz") | nindent 4 }}
    periodSeconds: {{ $startup.periodSeconds | default 1 }}
    timeoutSeconds: {{ $startup.timeoutSeconds | default 3 }}
    failureThreshold: {{ $startup.failureThreshold | default 60 }}
  readinessProbe:
    {{- include "ragtoll-sidecar.probeHandler" (dict "v" $v "path" "/readyz") | nindent 4 }}
    periodSeconds: {{ $readiness.periodSeconds | default 10 }}
    timeoutSeconds: {{ $readiness.timeoutSeconds | default 3 }}
    failureThreshold: {{ $readiness.failureThreshold | default 3 }}
  livenessProbe:
    {{- include "ragtoll-sidecar.probeHandler" (dict "v" $v "path" "/healthz") | nindent 4 }}
    periodSeconds: {{ $liveness.periodSeconds | default 20 }}
    timeoutSeconds: {{ $liveness.timeoutSeconds | default 3 }}
    failureThreshold: {{ $liveness.failureThreshold | default 3 }}
  {{- if and (not $native) $v.waitForReady }}
  lifecycle:
    # Classic sidecar: the kubelet starts the pod's containers in order and waits for a
    # postStart hook before starting the next one, so the agent starts after ragtoll is ready.
    postStart:
      exec:
        command:
          - python
          - -c
          - {{ include "ragtoll-sidecar.waitScript" $v | quote }}
  {{- end }}
  {{- with $v.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml ($v.securityContext | default (include "ragtoll-sidecar.securityContext" . | fromYaml)) | nindent 4 }}
  volumeMounts:
    {{- include "ragtoll-sidecar.volumeMounts" $v | nindent 4 }}
{{- end -}}

{{/* "true" unless v.native is explicitly false. */}}
{{- define "ragtoll-sidecar.native" -}}
{{- if hasKey . "native" -}}{{ .native | toString }}{{- else -}}true{{- end -}}
{{- end -}}

{{/* The hardened default: non-root, read-only root filesystem, no privilege escalation, no capabilities. */}}
{{- define "ragtoll-sidecar.securityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
A probe handler for `path`. On a loopback bind (the sidecar default) the kubelet cannot reach the
port (it probes the pod IP), so the probe runs the image's Python against 127.0.0.1 instead.
*/}}
{{- define "ragtoll-sidecar.probeHandler" -}}
{{- $port := .v.port | default 8787 | int -}}
{{- if include "ragtoll-sidecar.loopback" .v | eq "true" -}}
exec:
  command:
    - python
    - -c
    - {{ printf "import urllib.request as u; u.urlopen('http://127.0.0.1:%d%s', timeout=2)" $port .path | quote }}
{{- else -}}
httpGet:
  path: {{ .path }}
  port: ragtoll
{{- end -}}
{{- end -}}

{{- define "ragtoll-sidecar.loopback" -}}
{{- $host := .host | default "127.0.0.1" -}}
{{- has $host (list "127.0.0.1" "localhost" "::1") | toString -}}
{{- end -}}

{{/* Polls /readyz for up to 120 s; a non-zero exit makes the kubelet restart the container. */}}
{{- define "ragtoll-sidecar.waitScript" -}}
{{- $port := .port | default 8787 | int -}}
{{- printf "import time, urllib.request as u\nfor _ in range(240):\n    try:\n        u.urlopen('http://127.0.0.1:%d/readyz', timeout=1); break\n    except Exception:\n        time.sleep(0.5)\nelse:\n    raise SystemExit('ragtoll not ready after 120 s')" $port -}}
{{- end -}}
