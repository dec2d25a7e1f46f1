# shellcheck shell=bash
# pubsub: Google Cloud Pub/Sub's emulator (a JVM), in memory, on a free port
# (DEDUP_PUBSUB_EMULATOR_HOST). It is the Debian package google-cloud-cli-pubsub-emulator,
# from Google's own apt repository: not installed by this script; DEDUP_PUBSUB_EMULATOR names
# its launcher elsewhere. Where it is missing, `start` says so in one line and goes on
# without it (its tests then skip, or fail under DEDUP_TEST_STRICT=1). JVM options for a
# short start (C1 only, serial GC, the class-data archive): about 2.5 s instead of 8 s on 2
# busy cores; the tests' load needs no optimizing compiler.

# Nothing installed: see above.
pubsub_packages() { :; }

pubsub_launcher() {
    local bin=${DEDUP_PUBSUB_EMULATOR:-/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator}
    [[ -x $bin ]] && have java && echo "$bin"
}

# Ready when its HTTP side answers `GET /` with 200 (it serves REST and gRPC on one port).
pubsub_ping() {
    local port=$1 reply
    reply=$(
        { exec 3<>"/dev/tcp/$HOST/$port"; } 2>/dev/null || exit 1
        printf 'GET / HTTP/1.0\r\nHost: %s\r\n\r\n' "$HOST:$port" >&3
        timeout 2 head -c 12 <&3
    ) || return 1
    [[ $reply == "HTTP/1."?" 200" ]]
}

pubsub_alive() { [[ -f $STATE_DIR/pubsub/port ]] && pubsub_ping "$(<"$STATE_DIR/pubsub/port")"; }

pubsub_start() {
    local dir=$STATE_DIR/pubsub port bin
    if ! bin=$(pubsub_launcher); then
        log "pubsub: Google's Pub/Sub emulator (package google-cloud-cli-pubsub-emulator) or java not found: not started; its tests skip (fail under DEDUP_TEST_STRICT=1)"
        return 0
    fi
    port=$(free_ports 1)
    echo "$port" >"$dir/port"
    # The launcher execs java, so $! is the JVM.
    spawn "$dir/emulator.log" env JAVA_OPTS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto ${JAVA_OPTS:-}" \
        "$bin" --host="$HOST" --port="$port"
    echo $! >"$dir/emulator.pid"
    retry $((WAIT_SECONDS * 10)) 0.1 pubsub_ping "$port" ||
        { show_log "$dir/emulator.log"; die "the Pub/Sub emulator did not answer on port $port"; }
    write_url pubsub DEDUP_PUBSUB_EMULATOR_HOST "$HOST:$port"
}

pubsub_stop() { kill_pidfile "$STATE_DIR/pubsub/emulator.pid"; }
