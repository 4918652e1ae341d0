{{/* Names and labels, in the shape `helm create` gives them. */}}
{{- define "gpuwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpuwatch.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpuwatch.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{- define "gpuwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpuwatch.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 }}
{{ include "gpuwatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gpuwatch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpuwatch.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Anything that asks for credentials: basic auth, or client certificates required. */}}
{{- define "gpuwatch.authenticated" -}}
{{- if or .Values.basicAuth.users (eq .Values.tlsServerConfig.clientAuthType "RequireAndVerifyClientCert") }}true{{ end }}
{{- end }}

{{- define "gpuwatch.webConfig" -}}
{{- if or .Values.tlsServerConfig.enabled .Values.basicAuth.users }}true{{ end }}
{{- end }}

{{- define "gpuwatch.webhookSecret" -}}
{{- default (printf "%s-webhook" (include "gpuwatch.fullname" .)) .Values.webhook.existingSecret }}
{{- end }}

{{- define "gpuwatch.scheme" -}}
{{- if .Values.tlsServerConfig.enabled }}https{{ else }}http{{ end }}
{{- end }}

{{/* nodes/proxy for /pods where the kubelet has no fine-grained authorization (< 1.33). */}}
{{- define "gpuwatch.nodesProxy" -}}
{{- $v := .Values.kubernetes.rbac.nodesProxy }}
{{- if kindIs "invalid" $v }}
{{- if semverCompare "<1.33-0" .Capabilities.KubeVersion.Version }}true{{ end }}
{{- else if $v }}true{{ end }}
{{- end }}
