{{/* Names and labels shared by every template. The fullname prefixes every object name,
     Services included, so it must be a DNS-1035 label: a release name's dots (Helm allows
     my.release) become '-', and 50 characters leave room for the longest suffix
     (-engine-cache) within 63. validate.yaml refuses a release name starting with a digit. */}}
{{- define "edgewise.fullname" -}}
{{- $release := .Release.Name | replace "." "-" -}}
{{- if contains .Chart.Name $release -}}
{{- $release | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" $release .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "edgewise.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "edgewise.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name | quote }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Image reference: image.tag (default appVersion); GPU workers run the CUDA build of the
     same release, "<tag>-cuda", a pinned image.tag included (a tag that already ends in
     -cuda is kept as it is). With a digest the reference is <repository>:<tag>@sha256:...,
     which the runtime pulls by digest (the tag is only for people): image.digest for the
     image itself, image.cudaDigest for the "<tag>-cuda" image the chart derives for GPU
     workers (another image, so another digest; validate.yaml asks for it when image.digest
     is set). */}}
{{- define "edgewise.image" -}}
{{- $tag := .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- $digest := .root.Values.image.digest -}}
{{- if and .gpu (include "edgewise.derivedCudaImage" .root) -}}
{{- $tag = printf "%s-cuda" $tag -}}
{{- $digest = .root.Values.image.cudaDigest -}}
{{- end -}}
{{- printf "%s:%s" .root.Values.image.repository $tag -}}
{{- with $digest -}}@{{ . }}{{- end -}}
{{- end -}}

{{/* "true" when GPU workers run the "<tag>-cuda" image the chart derives (worker.profile=gpu
     and an image.tag not already ending in -cuda): an image other than the gateway's. The one
     rule of that derivation: edgewise.image and validate.yaml ask it. */}}
{{- define "edgewise.derivedCudaImage" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if and (eq .Values.worker.profile "gpu") (not (hasSuffix "-cuda" $tag)) -}}true{{- end -}}
{{- end -}}

{{/* Service accounts: the gateway watches EndpointSlices, the autoscaler patches the worker scale.
     With serviceAccount.create=false both run as serviceAccount.name (validate.yaml requires
     it), which the gateway's Role is still bound to (rbac.yaml). */}}
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

{{/* ServiceAccount annotations (workload identity): serviceAccount.annotations on every
     account the chart creates, under the account's own (serviceAccount.gateway.annotations or
     serviceAccount.autoscaler.annotations), which win on a key both set; empty when there are
     none. Args: root, account. */}}
{{- define "edgewise.serviceAccountAnnotations" -}}
{{- $own := dig .account "annotations" (dict) .root.Values.serviceAccount -}}
{{- $annotations := merge (dict) ($own | default dict) (.root.Values.serviceAccount.annotations | default dict) -}}
{{- with $annotations }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/* autoscaling.keda.query as the ScaledObject gets it. It is never rendered as a template:
     tpl would let a values file call lookup (read Secrets with the installer's rights),
     include, env and the rest. Its two placeholders, {{ .Release.Namespace }} and
     {{ .Release.Name }} (spaces inside the braces optional), are replaced as plain text;
     validate.yaml refuses a query with any other {{ left. */}}
{{- define "edgewise.kedaQuery" -}}
{{- $q := .Values.autoscaling.keda.query -}}
{{- $q = regexReplaceAllLiteral "\\{\\{\\s*\\.Release\\.Namespace\\s*\\}\\}" $q .Release.Namespace -}}
{{- $q = regexReplaceAllLiteral "\\{\\{\\s*\\.Release\\.Name\\s*\\}\\}" $q .Release.Name -}}
{{- $q -}}
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

{{- define "edgewise.engineCacheClaim" -}}
{{- .Values.worker.engineCache.pvc.claimName | default (printf "%s-engine-cache" (include "edgewise.fullname" .)) -}}
{{- end -}}

{{- define "edgewise.brokerHost" -}}
{{- if .Values.mqtt.broker.enabled -}}
{{- printf "%s-mosquitto" (include "edgewise.fullname" .) -}}
{{- else -}}
{{- .Values.mqtt.external.host -}}
{{- end -}}
{{- end -}}

{{/* Pod template metadata: the chart's labels plus podLabels (the component's beat the
     chart-wide ones); annotations: the component's podAnnotations beat the chart-wide ones,
     which beat the chart's own. Args: root, component, values (the component's values, or
     none), annotations (the chart's, a dict). */}}
{{- define "edgewise.podMetadata" -}}
{{- $v := .values | default dict -}}
{{- /* sprig merge: earlier dicts win, so the component's values beat the chart-wide ones */}}
{{- $labels := merge (dict) ($v.podLabels | default dict) (.root.Values.podLabels | default dict) -}}
{{- $annotations := merge (dict) ($v.podAnnotations | default dict) (.root.Values.podAnnotations | default dict) (.annotations | default dict) -}}
labels:
  {{- include "edgewise.labels" .root | nindent 2 }}
  app.kubernetes.io/component: {{ .component }}
  {{- with $labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Scheduling and pass-throughs shared by the gateway and worker pod specs: priority class,
     topology spread (a constraint without labelSelector gets the component's pods). */}}
{{- define "edgewise.podScheduling" -}}
{{- $v := .values -}}
{{- with $v.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with $v.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- range . }}
  {{- $c := deepCopy . }}
  {{- if not (hasKey $c "labelSelector") }}
  {{- $_ := set $c "labelSelector" (dict "matchLabels" (include "edgewise.selector" (dict "root" $.root "component" $.component) | fromYaml)) }}
  {{- end }}
  - {{- toYaml $c | nindent 4 }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* PromQL label matchers of this release's series: the namespace and the pods'
     app.kubernetes.io/instance label (the ServiceMonitor's podTargetLabels copy it). */}}
{{- define "edgewise.promSelector" -}}
namespace="{{ .Release.Namespace }}",app_kubernetes_io_instance="{{ .Release.Name }}"
{{- end -}}

{{/* Labels the chart sets on pods; podLabels must not override them (validate.yaml). */}}
{{- define "edgewise.reservedLabels" -}}
{{- list "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/version" "app.kubernetes.io/managed-by" "app.kubernetes.io/component" "helm.sh/chart" | toJson -}}
{{- end -}}

{{/* "true" when the gateway PodDisruptionBudget can be satisfied: fewer pods must stay up
     than gateway.replicas (minAvailable as a count or a percentage, rounded up as the
     disruption controller does); else a drain could never evict a gateway pod. */}}
{{- define "edgewise.gatewayPdbFits" -}}
{{- $replicas := int .Values.gateway.replicas -}}
{{- $min := .Values.gateway.pdb.minAvailable -}}
{{- $need := 0 -}}
{{- if kindIs "string" $min -}}
{{- $need = div (add (mul $replicas (trimSuffix "%" $min | int)) 99) 100 -}}
{{- else -}}
{{- $need = int $min -}}
{{- end -}}
{{- if lt $need $replicas -}}true{{- end -}}
{{- end -}}

{{/* A Kubernetes quantity (a number, or a string such as 500m, 4Gi or 1e3) in base units, as
     a number for comparisons (validate.yaml: requests <= limits); empty when it is not one. */}}
{{- define "edgewise.quantity" -}}
{{- $q := toString . | trim -}}
{{- $grammar := "^\\+?([0-9]+\\.?[0-9]*|\\.[0-9]+)([eE][-+]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$" -}}
{{- if regexMatch $grammar $q -}}
{{- $number := regexReplaceAll $grammar $q "${1}" | float64 -}}
{{- $suffix := regexReplaceAll $grammar $q "${2}" -}}
{{- $scale := dict "" 1.0 "n" 1e-9 "u" 1e-6 "m" 1e-3 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- if hasKey $scale $suffix -}}
{{- mulf $number (get $scale $suffix) -}}
{{- else -}}
{{- trimPrefix "+" $q | float64 -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Seconds the gateway pod gets to stop (terminationGracePeriodSeconds): its
     gateway.config.shutdown_delay_s (still serving while the Service drops the pod; the
     gateway's default 0 when unset) and shutdown_grace_s (draining; the gateway's default 10 s
     when unset), rounded up, plus 15 s for the process to exit after draining; never below
     Kubernetes' default 30 s. */}}
{{- define "edgewise.gatewayTerminationGrace" -}}
{{- $config := .Values.gateway.config | default dict -}}
{{- $delay := (hasKey $config "shutdown_delay_s") | ternary $config.shutdown_delay_s 0.0 | toString | trim | float64 -}}
{{- $grace := (hasKey $config "shutdown_grace_s") | ternary $config.shutdown_grace_s 10.0 | toString | trim | float64 -}}
{{- max 30 (add (ceil (addf $delay $grace)) 15) | int64 -}}
{{- end -}}

{{/* A number value that may be written as text (helm --set passes 1.5 as text): the number
     itself, written as Helm writes a number from a values file, so both spellings render alike.
     The schema has checked the text's form and validate.yaml its range. */}}
{{- define "edgewise.number" -}}
{{- toString . | trim | float64 -}}
{{- end -}}

{{/* The largest MQTT packet the gateway's bridge takes (cloud/gateway/mqtt_bridge.py
     receive_limit): twice gateway.config.limits.max_message_bytes (the gateway's default
     8 MiB when unset) and 1 MiB for topic and properties. The chart's broker takes no larger
     packet: Mosquitto's default is 256 MB, which one device could send into a broker of 256 MiB. */}}
{{- define "edgewise.mqttMaxPacket" -}}
{{- $limits := dig "limits" (dict) (.Values.gateway.config | default dict) -}}
{{- $messageBytes := (hasKey $limits "max_message_bytes") | ternary $limits.max_message_bytes 8388608 | int64 -}}
{{- min 268435455 (add (mul 2 $messageBytes) 1048576) -}}
{{- end -}}

{{/* A container's resources from a values map (dict "resources" .Values.x.resources "extra"
     (dict NAME COUNT)): its requests and limits, each with the extra keys added (the GPU a
     worker of profile gpu asks for), an empty one left out. A map the operator removed with
     null (`--set worker.resources=null`, Helm's way to drop a default) renders as none, where
     it was a nil-pointer error of the template (gateway, broker) or YAML that did not parse
     (worker). */}}
{{- define "edgewise.resources" -}}
{{- $resources := .resources | default dict -}}
{{- $out := dict -}}
{{- range $kind := list "requests" "limits" -}}
{{- $m := merge (dict) ($.extra | default dict) (get $resources $kind | default dict) -}}
{{- if $m }}{{ $_ := set $out $kind $m }}{{ end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}
