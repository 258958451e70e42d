{{/*
The one pod template shared by both modes. sidecar: ragtoll (native sidecar or first classic
container) + the agent; gateway: ragtoll alone, bound to 0.0.0.0 behind the Service.
*/}}
{{- define "ragtoll.pod" -}}
{{- $settings := include "ragtoll.sidecarSettings" . | fromYaml -}}
{{- $sidecar := eq .Values.mode "sidecar" -}}
metadata:
  annotations:
    checksum/ragtoll-config: {{ include "ragtoll.configChecksum" . }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  labels:
    {{- include "ragtoll.labels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "ragtoll.serviceAccountName" . }}
  automountServiceAccountToken: {{ .Values.serviceAccount.automountServiceAccountToken }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.podSecurityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
  {{- if $settings.native }}
  initContainers:
    {{- include "ragtoll-sidecar.container" (dict "root" . "v" $settings) | nindent 4 }}
  {{- end }}
  containers:
    {{- if not $settings.native }}
    {{- include "ragtoll-sidecar.container" (dict "root" . "v" $settings) | nindent 4 }}
    {{- end }}
    {{- if $sidecar }}
    {{- include "ragtoll.agentContainer" . | nindent 4 }}
    {{- end }}
  volumes:
    {{- include "ragtoll-sidecar.volumes" $settings | nindent 4 }}
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* The user's agent container, unchanged apart from the env that points it at ragtoll. */}}
{{- define "ragtoll.agentContainer" -}}
{{- $a := .Values.agent -}}
{{- $cfg := include "ragtoll.config" . | fromYaml -}}
{{- $own := list -}}
{{- range $a.env }}{{ $own = append $own .name }}{{ end -}}
- name: {{ $a.name }}
  image: {{ printf "%s:%s" $a.image.repository ($a.image.tag | toString) | quote }}
  imagePullPolicy: {{ $a.image.pullPolicy }}
  {{- with $a.command }}
  command:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $a.args }}
  args:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if or $a.wireEnv $a.env }}
  env:
    {{- if $a.wireEnv }}
    {{- include "ragtoll-sidecar.agentEnv" (dict "upstreams" $cfg.upstreams "port" (include "ragtoll.port" . | int) "envFromRoutes" $a.envFromRoutes "otel" (dict "endpoint" (include "ragtoll.otelEndpoint" .) "protocol" .Values.otel.protocol) "serviceName" ($a.serviceName | default $a.name) "skip" $own) | trim | nindent 4 }}
    {{- end }}
    {{- with $a.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  {{- with $a.envFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $a.ports }}
  ports:
    {{- range . }}
    - name: {{ .name }}
      containerPort: {{ .containerPort }}
      protocol: {{ .protocol | default "TCP" }}
    {{- end }}
  {{- end }}
  {{- with $a.livenessProbe }}
  livenessProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $a.readinessProbe }}
  readinessProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $a.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $a.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $a.volumeMounts }}
  volumeMounts:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
