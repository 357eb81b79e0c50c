{{/* Names and labels. */}}
{{- define "asyncdapo.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "asyncdapo.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Usage: include "asyncdapo.labels" (list $ "component") */}}
{{- define "asyncdapo.labels" -}}
{{- $ := index . 0 -}}
{{ include "asyncdapo.selectorLabels" $ }}
app.kubernetes.io/component: {{ index . 1 }}
app.kubernetes.io/part-of: asyncdapo
app.kubernetes.io/version: {{ $.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $.Chart.Name $.Chart.Version }}
{{- end -}}

{{- define "asyncdapo.componentSelector" -}}
{{- $ := index . 0 -}}
{{ include "asyncdapo.selectorLabels" $ }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "asyncdapo.cpuImage" -}}
{{ .Values.image.cpu.repository }}:{{ .Values.image.cpu.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "asyncdapo.gpuImage" -}}
{{ .Values.image.gpu.repository }}:{{ .Values.image.gpu.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "asyncdapo.redisUrl" -}}
{{- if .Values.redis.enabled -}}
redis://{{ include "asyncdapo.fullname" . }}-redis.{{ .Release.Namespace }}.svc:6379/0
{{- else -}}
{{ .Values.redis.external.url }}
{{- end -}}
{{- end -}}

{{- define "asyncdapo.verifierUrl" -}}
http://{{ include "asyncdapo.fullname" . }}-verifier.{{ .Release.Namespace }}.svc:{{ .Values.verifier.port }}
{{- end -}}

{{/* Restricted Pod Security Standard. Usage: include "asyncdapo.podSecurityContext" 10001 */}}
{{- define "asyncdapo.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ . }}
runAsGroup: {{ . }}
fsGroup: {{ . }}
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "asyncdapo.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: {{ . }}
runAsGroup: {{ . }}
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "asyncdapo.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* checkov skip annotations, only for the checks the workload fails, with the reason.
     Usage: include "asyncdapo.scannerSkips" (dict "image" $image "pullPolicy" $policy) */}}
{{- define "asyncdapo.scannerSkips" -}}
{{- $n := 0 -}}
{{- if not (contains "@sha256:" .image) }}
{{- $n = add1 $n }}
checkov.io/skip{{ $n }}: CKV_K8S_43=images are referenced by release tag from the chart values; set image tags to tag@sha256:digest to pin digests
{{- end }}
{{- if ne .pullPolicy "Always" }}
{{- $n = add1 $n }}
checkov.io/skip{{ $n }}: CKV_K8S_15=IfNotPresent by default as release tags are immutable and GPU images are many GB; setting image.pullPolicy to Always overrides it
{{- end }}
{{- end -}}
