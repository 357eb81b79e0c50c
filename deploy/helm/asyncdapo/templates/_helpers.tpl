{{/* Names: nameOverride / fullnameOverride as in `helm create`; 40 characters leave room for suffixes. */}}
{{- define "asyncdapo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "asyncdapo.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "asyncdapo.selectorLabels" -}}
app.kubernetes.io/name: {{ include "asyncdapo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Every object's labels: `commonLabels` under the chart's own (which win: selectors depend on
     them), then, when given, extra labels of the object (e.g. a Prometheus' selector label).
     Usage: include "asyncdapo.labels" (list $ "component" [extra]) */}}
{{- define "asyncdapo.labels" -}}
{{- $ := index . 0 -}}
{{- $ours := dict "app.kubernetes.io/component" (index . 1) "app.kubernetes.io/part-of" "asyncdapo" "app.kubernetes.io/version" $.Chart.AppVersion "app.kubernetes.io/managed-by" $.Release.Service "helm.sh/chart" (printf "%s-%s" $.Chart.Name $.Chart.Version) -}}
{{- $ours = merge $ours (include "asyncdapo.selectorLabels" $ | fromYaml) -}}
{{- $extra := dict -}}
{{- if gt (len .) 2 }}{{ $extra = index . 2 | default dict }}{{ end -}}
{{- toYaml (merge (dict) $ours $extra ($.Values.commonLabels | default dict)) -}}
{{- end -}}

{{- define "asyncdapo.componentSelector" -}}
{{- $ := index . 0 -}}
{{ include "asyncdapo.selectorLabels" $ }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* A pod template's metadata: the chart's podLabels/podAnnotations, the component's, then ours.
     Usage: include "asyncdapo.podMetadata" (list $ "component" .Values.component) */}}
{{- define "asyncdapo.podMetadata" -}}
{{- $ := index . 0 -}}
{{- $c := index . 2 -}}
{{- $labels := merge (include "asyncdapo.labels" (list $ (index . 1)) | fromYaml) ($c.podLabels | default dict) ($.Values.podLabels | default dict) -}}
{{- $ann := merge (dict) ($c.podAnnotations | default dict) ($.Values.podAnnotations | default dict) -}}
labels:
  {{- toYaml $labels | nindent 2 }}
{{- with $ann }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Scheduling fields of a pod spec: priority class, node selector, tolerations, affinity, topology
     spread (a constraint without labelSelector selects the component's pods).
     Usage: include "asyncdapo.podScheduling" (list $ "component" .Values.component) */}}
{{- define "asyncdapo.podScheduling" -}}
{{- $ := index . 0 -}}
{{- $component := index . 1 -}}
{{- $c := index . 2 -}}
{{- with ($c.priorityClassName | default $.Values.priorityClassName) }}
priorityClassName: {{ . }}
{{- end }}
{{- with $c.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.topologySpreadConstraints }}
topologySpreadConstraints:
{{- range . }}
{{- $t := deepCopy . }}
{{- if not $t.labelSelector }}
{{- $_ := set $t "labelSelector" (dict "matchLabels" (include "asyncdapo.componentSelector" (list $ $component) | fromYaml)) }}
{{- end }}
  - {{- toYaml $t | nindent 4 }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "asyncdapo.registry" -}}
{{- with .Values.global.imageRegistry }}{{ trimSuffix "/" . }}/{{ end -}}
{{- end -}}

{{/* Usage: include "asyncdapo.image" (list $ .Values.image.cpu) */}}
{{- define "asyncdapo.image" -}}
{{- $ := index . 0 -}}
{{- $img := index . 1 -}}
{{ include "asyncdapo.registry" $ }}{{ $img.repository }}:{{ $img.tag | default $.Chart.AppVersion }}
{{- end -}}

{{- define "asyncdapo.controlPlaneImage" -}}
{{ include "asyncdapo.image" (list . .Values.image.controlPlane) }}
{{- end -}}

{{- define "asyncdapo.cpuImage" -}}
{{ include "asyncdapo.image" (list . .Values.image.cpu) }}
{{- end -}}

{{- define "asyncdapo.gpuImage" -}}
{{ include "asyncdapo.image" (list . .Values.image.gpu) }}
{{- end -}}

{{- define "asyncdapo.redisImage" -}}
{{ include "asyncdapo.registry" . }}{{ .Values.redis.image.repository }}:{{ .Values.redis.image.tag }}
{{- end -}}

{{- define "asyncdapo.redisUrl" -}}
{{- if .Values.redis.enabled -}}
redis://{{ include "asyncdapo.fullname" . }}-redis.{{ .Release.Namespace }}.svc:6379/0
{{- else -}}
{{- /* The URL is rendered into the operator's env, the NOTES and every run's pods: a password
       in it would sit in all of them in clear. */}}
{{- if regexMatch "^rediss?://[^/@]*:[^/@]*@" .Values.redis.external.url -}}
{{- fail "redis.external.url carries a password (redis://USER:PASSWORD@HOST): the URL is rendered into the operator's environment and every run's pods; put the password in a Secret of the release namespace and name it in redis.external.passwordSecret (name, key), with a URL without it" -}}
{{- end -}}
{{ .Values.redis.external.url }}
{{- end -}}
{{- end -}}

{{/* The Secret (release namespace) holding the default Redis' password: name and key, or empty. */}}
{{- define "asyncdapo.redisSecretName" -}}
{{- if .Values.redis.enabled -}}
{{- .Values.redis.auth.existingSecret | default (printf "%s-redis-auth" (include "asyncdapo.fullname" .)) -}}
{{- else -}}
{{- .Values.redis.external.passwordSecret.name -}}
{{- end -}}
{{- end -}}

{{- define "asyncdapo.redisSecretKey" -}}
{{- if .Values.redis.enabled -}}
{{- .Values.redis.auth.existingSecretKey -}}
{{- else -}}
{{- .Values.redis.external.passwordSecret.key -}}
{{- end -}}
{{- end -}}

{{- define "asyncdapo.verifierUrl" -}}
http://{{ include "asyncdapo.fullname" . }}-verifier.{{ .Release.Namespace }}.svc:{{ .Values.verifier.port }}
{{- end -}}

{{- define "asyncdapo.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (printf "%s-operator" (include "asyncdapo.fullname" .)) -}}
{{- else -}}
{{- required "serviceAccount.name is required with serviceAccount.create=false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Namespaces whose pods may use the chart's Redis and verifier (NetworkPolicy, by name). */}}
{{- define "asyncdapo.clientNamespaces" -}}
{{- $ns := .Values.networkPolicy.clientNamespaces | default (prepend .Values.operator.watchNamespaces .Release.Namespace) -}}
{{- toJson (uniq $ns) -}}
{{- end -}}

{{/* The fixed restricted contexts (UID 10001), for templates that take no values for them.
     Usage: include "asyncdapo.podSecurityContext" 10001 */}}
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

{{/* A component's pod / container securityContext: its own when it sets one, else the chart's
     (`podSecurityContext` / `securityContext`, restricted with UID 10001 by default). A component's
     object replaces the chart's whole (no merge), so removing a key (OpenShift: runAsUser: null)
     is done in one place. Usage: include "asyncdapo.podSecurity" (list $ .Values.component) */}}
{{- define "asyncdapo.podSecurity" -}}
{{- $ := index . 0 -}}
{{- $c := index . 1 -}}
{{- toYaml ($c.podSecurityContext | default $.Values.podSecurityContext) -}}
{{- end -}}

{{- define "asyncdapo.containerSecurity" -}}
{{- $ := index . 0 -}}
{{- $c := index . 1 -}}
{{- toYaml ($c.securityContext | default $.Values.securityContext) -}}
{{- end -}}

{{/* Names of the pull secrets: global ones first; each entry a name or {name: x} (both forms
     are in use across charts). */}}
{{- define "asyncdapo.imagePullSecretNames" -}}
{{- $names := list -}}
{{- range concat (.Values.global.imagePullSecrets | default list) (.Values.imagePullSecrets | default list) -}}
{{- if kindIs "string" . }}{{ $names = append $names . }}{{ else }}{{ $names = append $names .name }}{{ end -}}
{{- end -}}
{{- toJson (uniq $names) -}}
{{- end -}}

{{- define "asyncdapo.imagePullSecrets" -}}
{{- with include "asyncdapo.imagePullSecretNames" . | fromJsonArray }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Label selector as `key=value,…` (the operator's --monitoring-namespace-selector). */}}
{{- define "asyncdapo.selectorFlag" -}}
{{- $pairs := list -}}
{{- range $k, $v := . }}{{ $pairs = append $pairs (printf "%s=%s" $k $v) }}{{ end -}}
{{- join "," $pairs -}}
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
{{- if .secretEnv }}
{{- $n = add1 $n }}
checkov.io/skip{{ $n }}: CKV_K8S_35=the Redis password is read from the ASYNCDAPO_REDIS_PASSWORD variable by every asyncdapo process (redis-server itself reads it from a file)
{{- end }}
{{- if .oneShot }}
{{- $n = add1 $n }}
checkov.io/skip{{ $n }}: CKV_K8S_8=a helm test pod runs one check and exits, there is no long-running process to probe
{{- $n = add1 $n }}
checkov.io/skip{{ $n }}: CKV_K8S_9=a helm test pod runs one check and exits, there is no long-running process to probe
{{- end }}
{{- if .apiToken }}
{{- $n = add1 $n }}
checkov.io/skip{{ $n }}: CKV_K8S_38=this test pod reads the TrainingRun CRD through the API with a token whose role allows only that
{{- end }}
{{- end -}}
