#!/bin/sh
# The admission webhook's serving certificate: a private CA and a certificate for the webhook's
# Service (gpupool-webhook.gpupool.svc), made with openssl. The API server calls webhooks over HTTPS
# only and checks the certificate against the caBundle of the MutatingWebhookConfiguration.
#
#   deploy/kubernetes/webhook-cert.sh DIR             files only: DIR/ca.crt, DIR/tls.crt, DIR/tls.key
#   deploy/kubernetes/webhook-cert.sh DIR --apply     also store them in the cluster (kubectl):
#       the Secret gpupool/gpupool-webhook-tls and the caBundle of MutatingWebhookConfiguration gpupool
#
# Valid 2 years; run it again (with --apply) to renew, then `kubectl -n gpupool rollout restart
# deployment/gpupool-webhook`. With cert-manager instead: a Certificate for the same DNS names into the
# same Secret, and the annotation cert-manager.io/inject-ca-from on the MutatingWebhookConfiguration.
set -eu
usage() { echo "usage: $0 DIR [--apply] [--namespace NS] [--service NAME]" >&2; exit 2; }
[ $# -ge 1 ] || usage
dir=$1; shift
apply=no; ns=gpupool; svc=gpupool-webhook
while [ $# -gt 0 ]; do
  case "$1" in
    --apply) apply=yes ;;
    --namespace) [ $# -ge 2 ] || usage; ns=$2; shift ;;
    --service) [ $# -ge 2 ] || usage; svc=$2; shift ;;
    *) usage ;;
  esac
  shift
done
command -v openssl >/dev/null || { echo "$0: error: openssl not found (install it)" >&2; exit 1; }
mkdir -p "$dir"
umask 077
openssl req -x509 -newkey rsa:2048 -nodes -days 730 -subj "/CN=gpupool-webhook-ca" \
  -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=$svc.$ns.svc" \
  -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
printf 'subjectAltName=DNS:%s,DNS:%s.%s,DNS:%s.%s.svc,DNS:%s.%s.svc.cluster.local\nextendedKeyUsage=serverAuth\n' \
  "$svc" "$svc" "$ns" "$svc" "$ns" "$svc" "$ns" > "$dir/ext.cnf"
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
  -days 730 -extfile "$dir/ext.cnf" -out "$dir/tls.crt" 2>/dev/null
rm -f "$dir/tls.csr" "$dir/ext.cnf" "$dir/ca.srl"
echo "wrote $dir/ca.crt, $dir/tls.crt, $dir/tls.key for $svc.$ns.svc"
if [ "$apply" = yes ]; then
  kubectl -n "$ns" create secret tls "$svc-tls" --cert="$dir/tls.crt" --key="$dir/tls.key" \
    --dry-run=client -o yaml | kubectl apply -f -
  bundle=$(base64 < "$dir/ca.crt" | tr -d '\n')
  kubectl patch mutatingwebhookconfiguration gpupool --type=json \
    -p "[{\"op\": \"replace\", \"path\": \"/webhooks/0/clientConfig/caBundle\", \"value\": \"$bundle\"}]"
fi
