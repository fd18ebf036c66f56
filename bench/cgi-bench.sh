#!/usr/bin/env bash
# Measures notify throughput of pubsub.cgi under Apache 2.4 (mpm_event +
# mod_cgid, Debian's defaults) against hello-cgi, the floor: a CGI that only
# reads its body and answers. Not a test (nothing passes or fails); CI does
# not run it.
#
#     bench/cgi-bench.sh            # 2000 requests per measurement
#     BENCH_N=500 bench/cgi-bench.sh
#
# Needs: apache2, apache2-utils (ab). Run as root (Apache workers then run as
# www-data) or as a user (they run as that user). Honors CARGO_TARGET_DIR.
# Parts not built yet (pubsub-cgi, `pubsub-cgi serve`) print "n/a".
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
N=${BENCH_N:-2000}
CONCURRENCY=(1 8)
BODY='kn_to=/bench/t&kn_payload=hello&kn_response_format=simple'
APACHE=/usr/sbin/apache2
MODULES=/usr/lib/apache2/modules

for tool in "$APACHE" ab; do
    command -v "$tool" >/dev/null 2>&1 || { echo "missing $tool (apt-get install apache2 apache2-utils)" >&2; exit 1; }
done

echo "building release binaries..." >&2
if ! (cd "$repo" && cargo build --release --quiet -p kn-cgi --bins); then
    echo "full build failed; trying hello-cgi alone" >&2
    (cd "$repo" && cargo build --release --quiet -p kn-cgi --bin hello-cgi)
fi
hello_bin=$target/release/hello-cgi
pubsub_bin=$target/release/pubsub-cgi
[ -x "$hello_bin" ] || { echo "no $hello_bin" >&2; exit 1; }

work=$(mktemp -d /tmp/kn-bench.XXXXXX)
chmod 755 "$work"
mkdir -p "$work/cgi-bin" "$work/logs" "$work/events"
cp "$hello_bin" "$work/cgi-bin/hello-cgi"
have_pubsub=
if [ -x "$pubsub_bin" ]; then
    cp "$pubsub_bin" "$work/cgi-bin/pubsub.cgi"
    have_pubsub=1
fi
printf '%s' "$BODY" >"$work/body"

user_conf=
if [ "$(id -u)" -eq 0 ]; then
    chown www-data:www-data "$work/events" "$work/logs"
    user_conf=$'User www-data\nGroup www-data'
fi

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 20000))
        port_free "$p" && { echo "$p"; return; }
    done
}
wait_port() { # port seconds
    local i
    for ((i = 0; i < $2 * 20; i++)); do
        port_free "$1" || return 0
        sleep 0.05
    done
    return 1
}

serve_pid=
cleanup() {
    [ -f "$work/conf" ] && "$APACHE" -f "$work/conf" -k stop >/dev/null 2>&1 || true
    [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null || true
    sleep 0.5
    rm -rf "$work"
}
trap cleanup EXIT

# The built-in server, when it exists: `pubsub-cgi serve --listen ADDR`.
serve_port=
if [ -n "$have_pubsub" ]; then
    p=$(free_port)
    KN_EVENTS="$work/events-serve" "$pubsub_bin" serve --listen "127.0.0.1:$p" \
        >"$work/logs/serve.log" 2>&1 </dev/null &
    serve_pid=$!
    if wait_port "$p" 3; then
        serve_port=$p
    else
        kill "$serve_pid" 2>/dev/null || true
        serve_pid=
    fi
fi

port=$(free_port)
proxy_conf=
[ -n "$serve_port" ] && proxy_conf="ProxyPass /proxied/kn http://127.0.0.1:$serve_port/kn flushpackets=on"
pubsub_conf=
[ -n "$have_pubsub" ] && pubsub_conf="ScriptAlias /kn $work/cgi-bin/pubsub.cgi"

cat >"$work/conf" <<CONF
ServerRoot /usr/lib/apache2
ServerName 127.0.0.1
Listen 127.0.0.1:$port
LoadModule mpm_event_module $MODULES/mod_mpm_event.so
LoadModule authz_core_module $MODULES/mod_authz_core.so
LoadModule cgid_module $MODULES/mod_cgid.so
LoadModule alias_module $MODULES/mod_alias.so
LoadModule env_module $MODULES/mod_env.so
LoadModule proxy_module $MODULES/mod_proxy.so
LoadModule proxy_http_module $MODULES/mod_proxy_http.so
$user_conf
PidFile $work/httpd.pid
DefaultRuntimeDir $work
Mutex file:$work default
ScriptSock $work/cgid.sock
ErrorLog $work/logs/error.log
LogLevel warn
DocumentRoot $work
Timeout 300
# Debian's mods-available/mpm_event.conf
StartServers 2
MinSpareThreads 25
MaxSpareThreads 75
ThreadLimit 64
ThreadsPerChild 25
MaxRequestWorkers 150
MaxConnectionsPerChild 0
<Directory />
    Require all granted
</Directory>
SetEnv KN_EVENTS $work/events
ScriptAlias /hello $work/cgi-bin/hello-cgi
$pubsub_conf
$proxy_conf
CONF

"$APACHE" -f "$work/conf" -k start
wait_port "$port" 10 || { echo "apache did not start:" >&2; cat "$work/logs/error.log" >&2; exit 1; }

# Prints requests/s, or n/a when the target answers nothing useful. Non-2xx
# answers or failures are flagged after the figure.
measure() { # url concurrency
    local out rps failed non2xx
    out=$(ab -q -n "$N" -c "$2" -s 30 -p "$work/body" -T application/x-www-form-urlencoded "$1" 2>&1) || { echo "n/a"; return; }
    rps=$(awk '/^Requests per second:/ {print $4}' <<<"$out")
    failed=$(awk '/^Failed requests:/ {print $3}' <<<"$out")
    non2xx=$(awk '/^Non-2xx responses:/ {print $3}' <<<"$out")
    [ -z "$rps" ] && { echo "n/a"; return; }
    if [ "${non2xx:-0}" -gt 0 ] || [ "${failed:-0}" -gt 0 ]; then
        echo "$rps(!${non2xx:-0}non2xx,${failed:-0}failed)"
    else
        echo "$rps"
    fi
}

ratio() { # value floor
    case "$1" in n/a*) echo "n/a"; return ;; esac
    awk -v a="${1%%(*}" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'
}

declare -A rate
targets=(hello pubsub.cgi serve proxied)
url_of() {
    case "$1" in
        hello) echo "http://127.0.0.1:$port/hello" ;;
        pubsub.cgi) [ -n "$have_pubsub" ] && echo "http://127.0.0.1:$port/kn" ;;
        serve) [ -n "$serve_port" ] && echo "http://127.0.0.1:$serve_port/kn" ;;
        proxied) [ -n "$serve_port" ] && echo "http://127.0.0.1:$port/proxied/kn" ;;
    esac
    return 0
}

for t in "${targets[@]}"; do
    url=$(url_of "$t")
    for c in "${CONCURRENCY[@]}"; do
        if [ -z "$url" ]; then
            rate[$t,$c]=n/a
            continue
        fi
        # A short warm-up so that process caches and Apache workers are up.
        ab -q -n 50 -c "$c" -p "$work/body" -T application/x-www-form-urlencoded "$url" >/dev/null 2>&1 || true
        echo "measuring $t at c=$c ($N requests)..." >&2
        rate[$t,$c]=$(measure "$url" "$c")
    done
done

echo
echo "notify POSTs, $N requests each; Apache $("$APACHE" -v | sed -n 's/^Server version: //p'), mpm_event + mod_cgid; $(nproc) CPUs"
printf '%-28s' "target"
for c in "${CONCURRENCY[@]}"; do printf '%14s %9s' "req/s c=$c" "vs hello"; done
echo
label() {
    case "$1" in
        hello) echo "hello-cgi (floor)" ;;
        pubsub.cgi) echo "pubsub.cgi under Apache" ;;
        serve) echo "pubsub-cgi serve (direct)" ;;
        proxied) echo "serve behind mod_proxy" ;;
    esac
}
for t in "${targets[@]}"; do
    printf '%-28s' "$(label "$t")"
    for c in "${CONCURRENCY[@]}"; do
        printf '%14s %9s' "${rate[$t,$c]}" "$(ratio "${rate[$t,$c]}" "${rate[hello,$c]%%(*}")"
    done
    echo
done
errors=$(grep -v 'AH00558\|resuming normal\|caught SIG' "$work/logs/error.log" | tail -n 5 || true)
[ -n "$errors" ] && { echo; echo "last error log lines:"; echo "$errors"; }
exit 0
