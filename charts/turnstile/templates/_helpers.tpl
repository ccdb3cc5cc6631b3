{{/* The labels of every object: the ones deploy/ gives them, and Helm's own. */}}
{{- define "turnstile.labels" -}}
app.kubernetes.io/name: turnstile
app.kubernetes.io/part-of: turnstile
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The controller's labels, also its Pods' selector (as in deploy/). */}}
{{- define "turnstile.selector" -}}
app.kubernetes.io/name: turnstile
app.kubernetes.io/component: controller
{{- end }}

{{- define "turnstile.controllerLabels" -}}
{{ include "turnstile.labels" . }}
app.kubernetes.io/component: controller
{{- end }}

{{/* The image: by digest when one is given. */}}
{{- define "turnstile.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
{{- end }}
