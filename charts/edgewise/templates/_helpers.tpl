{{/* Names and labels shared by every template. */}}
{{- define "edgewise.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "edgewise.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "edgewise.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Image reference; GPU workers default to the -cuda tag. */}}
{{- define "edgewise.image" -}}
{{- $tag := .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- if and .gpu (not .root.Values.image.tag) -}}{{- $tag = printf "%s-cuda" $tag -}}{{- end -}}
{{- printf "%s:%s" .root.Values.image.repository $tag -}}
{{- end -}}

{{/* Service accounts: the gateway watches EndpointSlices, the autoscaler patches the worker scale. */}}
{{- define "edgewise.gatewaySA" -}}
{{- if .Values.serviceAccount.create -}}
{{- printf "%s-gateway" (include "edgewise.fullname" .) -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "edgewise.autoscalerSA" -}}
{{- if .Values.serviceAccount.create -}}
{{- printf "%s-autoscaler" (include "edgewise.fullname" .) -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Container security: non-root, read-only root FS, no capabilities, RuntimeDefault seccomp. */}}
{{- define "edgewise.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "edgewise.workerService" -}}
{{- printf "%s-worker" (include "edgewise.fullname" .) -}}
{{- end -}}

{{- define "edgewise.brokerHost" -}}
{{- if .Values.mqtt.broker.enabled -}}
{{- printf "%s-mosquitto" (include "edgewise.fullname" .) -}}
{{- else -}}
{{- .Values.mqtt.external.host -}}
{{- end -}}
{{- end -}}
