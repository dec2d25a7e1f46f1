# shellcheck shell=bash
# The test CA, not a server: a throwaway CA, a server certificate it signs (for localhost
# and 127.0.0.1), client certificates, and a second, unrelated CA (a client trusting only
# that one must refuse the servers). Made once per state dir, in tls/, by the first of
# postgres-tls, redis-tls and mariadb to start.

# A new P-256 key, unencrypted (openssl req's options).
readonly TLS_KEY=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)

# Print openssl when it is missing (a TLS server's packages).
tls_packages() { have openssl || echo openssl; }

ensure_certs() {
    local dir=$STATE_DIR/tls
    [[ -f $dir/done ]] && return 0
    mkdir -p "$dir"
    make_ca "$dir" ca "dedup test CA"
    make_ca "$dir" other-ca "dedup unrelated CA"
    openssl_step "server key" req "${TLS_KEY[@]}" -subj "/CN=localhost" \
        -keyout "$dir/server.key" -out "$dir/server.csr"
    printf '%s\n' "subjectAltName=DNS:localhost,IP:127.0.0.1" "basicConstraints=CA:FALSE" \
        "keyUsage=digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" >"$dir/server.ext"
    sign_csr "$dir" server ca server.ext "server certificate"
    # Client certificates: one from the CA, one from the unrelated CA.
    printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=digitalSignature" \
        "extendedKeyUsage=clientAuth" >"$dir/client.ext"
    make_client "$dir" client ca
    make_client "$dir" other-client other-ca
    # The servers run as other users and read their own copies; clients read the CAs and the
    # client certificates and keys (test material, thrown away with the state dir).
    chmod 755 "$dir"
    chmod 644 "$dir"/*.crt "$dir"/client.key "$dir"/other-client.key
    touch "$dir/done"
}

# openssl_step WHAT ARGS...: openssl ARGS, its messages in tls/openssl.log; dies naming WHAT.
openssl_step() {
    local what=$1
    shift
    openssl "$@" 2>>"$STATE_DIR/tls/openssl.log" ||
        { show_log "$STATE_DIR/tls/openssl.log"; die "openssl: $what"; }
}

# make_ca DIR NAME SUBJECT: a self-signed CA, DIR/NAME.crt and DIR/NAME.key.
make_ca() {
    local dir=$1 name=$2
    openssl_step "$name" req -x509 "${TLS_KEY[@]}" -days 3 -subj "/CN=$3" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -keyout "$dir/$name.key" -out "$dir/$name.crt"
}

# sign_csr DIR NAME CA EXT WHAT: DIR/NAME.csr signed by DIR/CA, with the extensions of DIR/EXT.
sign_csr() {
    local dir=$1 name=$2 ca=$3
    openssl_step "$5" x509 -req -in "$dir/$name.csr" -CA "$dir/$ca.crt" -CAkey "$dir/$ca.key" \
        -CAcreateserial -days 3 -extfile "$dir/$4" -out "$dir/$name.crt"
}

# make_client DIR NAME CA: a client key and certificate signed by CA.
make_client() {
    local dir=$1 name=$2
    openssl_step "$name certificate" req "${TLS_KEY[@]}" -subj "/CN=dedup test $name" \
        -keyout "$dir/$name.key" -out "$dir/$name.csr"
    sign_csr "$dir" "$name" "$3" client.ext "$name certificate"
}

# The CA lines every TLS service adds to its env lines.
write_tls_env() {
    local svc=$1
    printf "export DEDUP_TLS_CA='%s'\nexport DEDUP_TLS_OTHER_CA='%s'\n" \
        "$STATE_DIR/tls/ca.crt" "$STATE_DIR/tls/other-ca.crt" >>"$STATE_DIR/$svc/url.env"
}
