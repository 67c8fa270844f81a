{{/* Labels every object of the release carries. */}}
{{- define "tf.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tensorfusion
{{- end }}

{{/* The tfusion image. */}}
{{- define "tf.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The Secret holding the API token (key "token"). */}}
{{- define "tf.tokenSecret" -}}
{{- if .Values.token.existingSecret }}{{ .Values.token.existingSecret }}{{ else }}{{ .Release.Name }}-token{{ end }}
{{- end }}

{{/* The Secret holding the webhook's certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "tf.tlsSecret" -}}
{{- if .Values.webhook.tls.existingSecret }}{{ .Values.webhook.tls.existingSecret }}{{ else }}{{ .Release.Name }}-webhook-tls{{ end }}
{{- end }}

{{/* The controller's API, as the other components reach it (https with controller.tls.enabled). */}}
{{- define "tf.controllerURL" -}}
{{ if .Values.controller.tls.enabled }}https{{ else }}http{{ end }}://{{ .Release.Name }}-controller.{{ .Release.Namespace }}.svc:{{ .Values.controller.port }}
{{- end }}

{{/* The Secret holding the controller's certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "tf.controllerTlsSecret" -}}
{{- if .Values.controller.tls.existingSecret }}{{ .Values.controller.tls.existingSecret }}{{ else }}{{ .Release.Name }}-controller-tls{{ end }}
{{- end }}

{{/* Clients of a TLS controller verify it against the CA of its Secret (ca.crt only, no key). */}}
{{- define "tf.controllerCaArgs" -}}
{{- if .Values.controller.tls.enabled }}
- --ca-file
- /etc/tensorfusion/controller-ca/ca.crt
{{- end }}
{{- end }}
{{- define "tf.controllerCaMount" -}}
{{- if .Values.controller.tls.enabled }}
- name: controller-ca
  mountPath: /etc/tensorfusion/controller-ca
  readOnly: true
{{- end }}
{{- end }}
{{- define "tf.controllerCaVolume" -}}
{{- if .Values.controller.tls.enabled }}
- name: controller-ca
  secret:
    secretName: {{ include "tf.controllerTlsSecret" . }}
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- end }}

{{/* The webhook and extender Service's host name (the certificate must name it). */}}
{{- define "tf.webhookHost" -}}
{{ .Release.Name }}-webhook.{{ .Release.Namespace }}.svc
{{- end }}

{{/* The API token, mounted read-only at /etc/tensorfusion/token/token. */}}
{{- define "tf.tokenVolume" -}}
- name: token
  secret:
    secretName: {{ include "tf.tokenSecret" . }}
    defaultMode: 0440
    items:
      - key: token
        path: token
{{- end }}

{{/* A container that needs nothing from the host: no privilege, read-only root. */}}
{{- define "tf.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}
