#!/usr/bin/env bash
# Makes the certificate of the TensorFusion webhook and scheduler extender: a private CA and a
# server certificate for the webhook Service's DNS names, signed by it (openssl).
#
#   deploy/webhook-cert.sh --namespace NS [--release NAME] [--out DIR] [--days N] [--apply]
#
# Writes DIR/ca.crt, DIR/tls.crt, DIR/tls.key (DIR defaults to a new temporary folder) and prints
# the caBundle (base64 of ca.crt) for the chart's webhook.tls.caBundle. With --apply it also
# creates or replaces the Secret RELEASE-webhook-tls in NS and sets the caBundle of the
# MutatingWebhookConfiguration RELEASE-NS-pods (kubectl, current context).
set -euo pipefail

namespace=""
release="tensorfusion"
out=""
days=825
apply=0
usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --namespace) namespace="${2:-}"; shift 2 ;;
    --release) release="${2:-}"; shift 2 ;;
    --out) out="${2:-}"; shift 2 ;;
    --days) days="${2:-}"; shift 2 ;;
    --apply) apply=1; shift ;;
    -h|--help) usage ;;
    *) echo "webhook-cert.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
dns_label='^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'
if [ -z "$namespace" ]; then echo "webhook-cert.sh: --namespace is required" >&2; exit 2; fi
for v in "$namespace" "$release"; do
  if ! [[ "$v" =~ $dns_label ]] || [ ${#v} -gt 63 ]; then
    echo "webhook-cert.sh: '$v' is not a Kubernetes name (lowercase letters, digits, '-', at most 63)" >&2
    exit 2
  fi
done
if ! [[ "$days" =~ ^[0-9]+$ ]] || [ "$days" -lt 1 ] || [ "$days" -gt 3650 ]; then
  echo "webhook-cert.sh: --days takes 1 to 3650" >&2; exit 2
fi
if [ -z "$out" ]; then out="$(mktemp -d)"; fi
mkdir -p "$out"
umask 077

service="${release}-webhook"
host="${service}.${namespace}.svc"
openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$days" \
  -subj "/CN=${release}-webhook-ca" -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null
cat > "$out/server.ext" <<EOF
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:${service}, DNS:${service}.${namespace}, DNS:${host}, DNS:${host}.cluster.local
EOF
openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=${host}" \
  -keyout "$out/tls.key" -out "$out/server.csr" 2>/dev/null
openssl x509 -req -sha256 -days "$days" -in "$out/server.csr" -CA "$out/ca.crt" \
  -CAkey "$out/ca.key" -CAcreateserial -extfile "$out/server.ext" -out "$out/tls.crt" 2>/dev/null
rm -f "$out/server.csr" "$out/server.ext" "$out/ca.srl"
chmod 0644 "$out/ca.crt" "$out/tls.crt"

ca_bundle="$(base64 -w0 < "$out/ca.crt")"
echo "certificate for ${host} written to ${out} (ca.crt, tls.crt, tls.key; ca.key signs renewals)"
echo "caBundle: ${ca_bundle}"

if [ "$apply" = 1 ]; then
  kubectl -n "$namespace" create secret generic "${release}-webhook-tls" --type=kubernetes.io/tls \
    --from-file=tls.crt="$out/tls.crt" --from-file=tls.key="$out/tls.key" \
    --from-file=ca.crt="$out/ca.crt" --dry-run=client -o yaml | kubectl apply -f -
  kubectl patch mutatingwebhookconfiguration "${release}-${namespace}-pods" --type=json \
    -p "[{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"${ca_bundle}\"}]"
fi
