#!/usr/bin/env bash
# Makes the test cluster's certificates and kubeconfigs under $RUN/pki (kept across
# `down.sh`, so a cached start skips this): one CA, the API server's serving certificate,
# a client certificate per component (RBAC identities), the kubelet's serving
# certificate, and the service-account signing key. Not for anything but these tests.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
PKI=$RUN/pki
# Bumped when the set of certificates changes, so an older set is made anew.
PKI_REV=2
[ "$(cat "$PKI/.complete" 2>/dev/null)" = "$PKI_REV" ] && exit 0
rm -rf "$PKI"
mkdir -p "$PKI"
cd "$PKI"
days=3650

openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days $days \
  -subj "/CN=orchard-test-cluster-ca" 2>/dev/null

# cert NAME SUBJECT [SAN]: a key and a certificate signed by the CA.
cert() {
  local name=$1 subj=$2 san=${3:-}
  openssl req -newkey rsa:2048 -nodes -keyout "$name.key" -out "$name.csr" -subj "$subj" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [ -n "$san" ]; then
      echo "extendedKeyUsage=serverAuth,clientAuth"
      echo "subjectAltName=$san"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } > "$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$name.crt" \
    -days $days -extfile "$name.ext" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

svc_ip=${SERVICE_CIDR%.*}.1
cert apiserver "/CN=kube-apiserver" \
  "IP:$NODE_IP,IP:127.0.0.1,IP:$svc_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
cert admin "/O=system:masters/CN=orchard-test-admin"
cert controller-manager "/CN=system:kube-controller-manager"
cert scheduler "/CN=system:kube-scheduler"
cert kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME"
cert kubelet "/CN=$NODE_NAME" "IP:$NODE_IP,DNS:$NODE_NAME"
cert kube-router "/CN=kube-router"
openssl genrsa -out sa.key 2048 2>/dev/null
openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null

# kubeconfig NAME CERT: a kubeconfig for the client certificate CERT.
kubeconfig() {
  cat > "$1.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: orchard-test
  cluster:
    certificate-authority: $PKI/ca.crt
    server: https://$NODE_IP:$APISERVER_PORT
users:
- name: $1
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: orchard-test
  context:
    cluster: orchard-test
    user: $1
    namespace: default
current-context: orchard-test
KC
}
kubeconfig admin admin
kubeconfig controller-manager controller-manager
kubeconfig scheduler scheduler
kubeconfig kubelet kubelet-client
kubeconfig kube-router kube-router
chmod 600 ./*.key
echo "$PKI_REV" > .complete
