#!/usr/bin/env bash
# Makes X.509 credentials for the TLS tests, in DIR:
#   DIR/server     ca-cert.pem, server-cert.pem, server-key.pem  (onecopy serve --tls-certificates)
#   DIR/client     ca-cert.pem, client-cert.pem, client-key.pem  (qemu tls-creds-x509 dir=,
#                  libnbd tls-certificates=)
#   DIR/anonymous  ca-cert.pem only: a client that checks the server but has no certificate
# One authority signs a server certificate for localhost and 127.0.0.1 and a client
# certificate. P-256 keys keep it fast; the key usages are the ones qemu insists on.
set -euo pipefail
directory=${1:?usage: test-certificates.sh DIR}
work="$directory/pki"
mkdir -p "$work" "$directory/server" "$directory/client" "$directory/anonymous"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key "$work/ca-key.pem"
openssl req -x509 -new -key "$work/ca-key.pem" -out "$work/ca-cert.pem" -days 2 \
  -subj "/CN=onecopy test authority" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"

sign() { # NAME SUBJECT EXTENSIONS
  key "$work/$1-key.pem"
  openssl req -new -key "$work/$1-key.pem" -out "$work/$1.csr" -subj "$2"
  printf '%b' "$3" > "$work/$1.ext"
  openssl x509 -req -in "$work/$1.csr" -CA "$work/ca-cert.pem" -CAkey "$work/ca-key.pem" \
    -CAcreateserial -out "$work/$1-cert.pem" -days 2 -extfile "$work/$1.ext" 2>/dev/null
}
usage="keyUsage=critical,digitalSignature,keyEncipherment\nbasicConstraints=CA:FALSE\n"
sign server "/CN=localhost" "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n$usage"
sign client "/CN=onecopy test client" "extendedKeyUsage=clientAuth\n$usage"

cp "$work/ca-cert.pem" "$work/server-cert.pem" "$work/server-key.pem" "$directory/server/"
cp "$work/ca-cert.pem" "$work/client-cert.pem" "$work/client-key.pem" "$directory/client/"
cp "$work/ca-cert.pem" "$directory/anonymous/"
