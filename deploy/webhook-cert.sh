#!/usr/bin/env bash
# Makes the certificate of the TensorFusion webhook and scheduler extender: a private CA and a
# server certificate for the webhook Service's DNS names, signed by it (openssl).
#
#   deploy/webhook-cert.sh --namespace NS [--release NAME] [--out DIR] [--days N] [--new-ca] [--apply]
#
# Writes DIR/ca.crt, DIR/ca.key, DIR/tls.crt, DIR/tls.key (DIR defaults to a new temporary folder)
# and prints the caBundle (base64 of ca.crt) for the chart's webhook.tls.caBundle. The certificate
# is valid for N days (default 825). When DIR already holds ca.crt and ca.key (a renewal), the new
# certificate is signed with that CA, so the caBundle stays the same; otherwise, or with --new-ca,
# a new CA valid for 3650 days is made (and ca.crt changes: set the new caBundle). With --apply it
# also creates or replaces the Secret RELEASE-webhook-tls in NS and sets the caBundle of the
# MutatingWebhookConfiguration RELEASE-NS-pods (kubectl, current context).
set -euo pipefail

namespace=""
release="tensorfusion"
out=""
days=825
apply=0
new_ca=0
ca_days=3650
# The comment block above, without its '#'.
help_text() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
usage() { help_text >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --namespace) namespace="${2:-}"; shift 2 ;;
    --release) release="${2:-}"; shift 2 ;;
    --out) out="${2:-}"; shift 2 ;;
    --days) days="${2:-}"; shift 2 ;;
    --apply) apply=1; shift ;;
    --new-ca) new_ca=1; shift ;;
    -h|--help) help_text; exit 0 ;;
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
# A CA already in --out (a renewal) signs the new certificate, unless --new-ca: the caBundle the
# cluster holds then stays valid. It is checked before anything is written.
reuse_ca=0
replaced_ca=0
if [ -n "$out" ] && [ "$new_ca" = 1 ] && [ -e "$out/ca.crt" ]; then replaced_ca=1; fi
if [ -n "$out" ] && [ "$new_ca" = 0 ] && { [ -e "$out/ca.key" ] || [ -e "$out/ca.crt" ]; }; then
  if ! [ -e "$out/ca.key" ] || ! [ -e "$out/ca.crt" ]; then
    echo "webhook-cert.sh: $out holds only one of ca.crt and ca.key: put back the other to renew with that CA, or give --new-ca to make a new one (then set the new caBundle)" >&2
    exit 2
  fi
  ca_cert_key="$(openssl x509 -in "$out/ca.crt" -noout -pubkey 2>/dev/null)" || ca_cert_key=""
  ca_key_key="$(openssl pkey -in "$out/ca.key" -pubout 2>/dev/null)" || ca_key_key=""
  if [ -z "$ca_cert_key" ] || [ "$ca_cert_key" != "$ca_key_key" ]; then
    echo "webhook-cert.sh: $out/ca.key is not the key of $out/ca.crt (or one of them is not PEM): give the CA's own pair, or --new-ca to make a new one (then set the new caBundle)" >&2
    exit 2
  fi
  if ! openssl x509 -in "$out/ca.crt" -noout -checkend $((days * 86400)) >/dev/null; then
    ca_end="$(openssl x509 -in "$out/ca.crt" -noout -enddate | sed 's/^notAfter=//')"
    echo "webhook-cert.sh: the CA in $out expires ($ca_end) before a certificate of $days days would: give a smaller --days, or --new-ca to make a new CA (then set the new caBundle)" >&2
    exit 2
  fi
  reuse_ca=1
fi
if [ -z "$out" ]; then out="$(mktemp -d)"; fi
mkdir -p "$out"
umask 077

service="${release}-webhook"
host="${service}.${namespace}.svc"
if [ "$reuse_ca" = 0 ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$ca_days" \
    -subj "/CN=${release}-webhook-ca" -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null
fi
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
if [ "$reuse_ca" = 1 ]; then
  echo "certificate for ${host} written to ${out} (tls.crt, tls.key), signed with the CA already there (ca.crt unchanged: the caBundle stays the same)"
else
  echo "certificate for ${host} written to ${out} (ca.crt, tls.crt, tls.key) with a new CA; keep ca.key: a run with the same --out signs the renewal with it"
  if [ "$replaced_ca" = 1 ]; then
    echo "the CA that was in ${out} is replaced: set the new caBundle below (--apply does)"
  fi
fi
echo "caBundle: ${ca_bundle}"

if [ "$apply" = 1 ]; then
  kubectl -n "$namespace" create secret generic "${release}-webhook-tls" --type=kubernetes.io/tls \
    --from-file=tls.crt="$out/tls.crt" --from-file=tls.key="$out/tls.key" \
    --from-file=ca.crt="$out/ca.crt" --dry-run=client -o yaml | kubectl apply -f -
  kubectl patch mutatingwebhookconfiguration "${release}-${namespace}-pods" --type=json \
    -p "[{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"${ca_bundle}\"}]"
fi
