#!/usr/bin/env bash
# Make a cluster CA and a key + certificate signed by it for the coordinator
# and for each named peer, for TLS on the API and the control connections
# (docs/tls.md). For tests and trials: the CA key sits beside the
# certificates, unencrypted; a production CA keeps its key elsewhere.
#
#   deploy/make-test-ca.sh DIR [NAME[:HOST,HOST...]]...
#
# DIR gets
#   ca.pem, ca-key.pem                   the CA (made once, then reused)
#   coordinator.pem, coordinator-key.pem the coordinator's
#   NAME.pem, NAME-key.pem               each NAME's (an agent, a frontend)
# Every certificate names 127.0.0.1, ::1 and localhost, its NAME and the
# HOSTs after a ':' (IP addresses or DNS names), and serves as a TLS server
# and client certificate alike. "coordinator:10.0.0.5,coord.example" adds
# the addresses agents and frontends dial the coordinator at: they check
# the coordinator's certificate against the address they dial.
#
# Idempotent: an existing CA is kept, and an existing certificate that this
# CA signed is kept; a certificate from another CA, or a missing one, is
# made (again). Keys are mode 600. Needs certtool (Debian: gnutls-bin).
# Exit codes: 0 done, 2 usage error, 1 certtool failed or missing.
set -euo pipefail

usage() {
  echo "usage: $0 DIR [NAME[:HOST,HOST...]]..." >&2
  exit 2
}
[[ $# -ge 1 && $1 != -* ]] || usage
DIR=$1
shift
command -v certtool >/dev/null ||
  { echo "make-test-ca: certtool not found (Debian: apt-get install gnutls-bin)" >&2; exit 1; }

mkdir -p "$DIR"
chmod 700 "$DIR"
umask 077
DAYS=${LYNX_CA_DAYS:-3650}
[[ $DAYS =~ ^[0-9]+$ ]] ||
  { echo "make-test-ca: LYNX_CA_DAYS='$DAYS' is not a number of days" >&2; exit 2; }

# certtool reads what to put in a certificate from a template file
tmpl=$(mktemp)
trap 'rm -f "$tmpl"' EXIT

if [[ ! -s $DIR/ca.pem || ! -s $DIR/ca-key.pem ]]; then
  certtool --generate-privkey --key-type ecdsa --outfile "$DIR/ca-key.pem" 2>/dev/null
  cat >"$tmpl" <<EOF
cn = "Lynx test cluster CA"
ca
cert_signing_key
crl_signing_key
expiration_days = $DAYS
EOF
  certtool --generate-self-signed --load-privkey "$DIR/ca-key.pem" \
    --template "$tmpl" --outfile "$DIR/ca.pem" 2>/dev/null
  echo "make-test-ca: made the CA $DIR/ca.pem" >&2
fi

# make_cert NAME HOSTS: NAME.pem and NAME-key.pem, unless this CA signed one
make_cert() {
  local name=$1 hosts=$2 h
  if [[ -s $DIR/$name.pem && -s $DIR/$name-key.pem ]] &&
     certtool --verify --load-ca-certificate "$DIR/ca.pem" \
       --infile "$DIR/$name.pem" >/dev/null 2>&1; then
    return 0
  fi
  certtool --generate-privkey --key-type ecdsa --outfile "$DIR/$name-key.pem" 2>/dev/null
  {
    echo "cn = \"$name\""
    echo "expiration_days = $DAYS"
    echo "tls_www_server"
    echo "tls_www_client"
    echo "signing_key"
    echo "ip_address = \"127.0.0.1\""
    echo "ip_address = \"::1\""
    echo "dns_name = \"localhost\""
    for h in $name ${hosts//,/ }; do
      if [[ $h =~ ^[0-9.]+$ || $h == *:* ]]; then
        echo "ip_address = \"$h\""
      else
        echo "dns_name = \"$h\""
      fi
    done
  } >"$tmpl"
  certtool --generate-certificate --load-privkey "$DIR/$name-key.pem" \
    --load-ca-certificate "$DIR/ca.pem" --load-ca-privkey "$DIR/ca-key.pem" \
    --template "$tmpl" --outfile "$DIR/$name.pem" 2>/dev/null
  chmod 644 "$DIR/$name.pem"
  echo "make-test-ca: made $DIR/$name.pem (127.0.0.1, ::1, localhost, $name${hosts:+, $hosts})" >&2
}

coord_hosts=""
names=()
for arg in "$@"; do
  name=${arg%%:*}
  hosts=""
  [[ $arg == *:* ]] && hosts=${arg#*:}
  [[ $name =~ ^[A-Za-z0-9._-]+$ && $name != ca ]] ||
    { echo "make-test-ca: '$name' is not a name (letters, digits, '.', '_', '-'; not 'ca')" >&2; exit 2; }
  if [[ $name == coordinator ]]; then
    coord_hosts=$hosts
  else
    names+=("$name:$hosts")
  fi
done
chmod 644 "$DIR/ca.pem"
make_cert coordinator "$coord_hosts"
for n in "${names[@]+"${names[@]}"}"; do
  make_cert "${n%%:*}" "${n#*:}"
done
