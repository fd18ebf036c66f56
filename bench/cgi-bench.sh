#!/usr/bin/env bash
# The benchmark of the issue, in one run on one Apache 2.4 (mpm_event +
# mod_cgid, Debian's defaults), over loopback, with bounded counts:
#
#  1. notify requests/s (ab, concurrency 1 and 8) of
#       - hello-c, the floor: bench/hello-c.c, a C hello-world CGI (printf
#         of a header and a line), compiled here with `cc -O2`, and the
#         same linked statically (`cc -O2 -static`, hello-c-static);
#       - hello-cgi: a Rust CGI that only reads its body as notify must
#         and answers;
#       - pubsub.cgi as a CGI under Apache, built as docs/DEPLOY.md installs
#         it (`cargo build-cgi-musl`: static, musl, position-dependent; goal: >= 1.0 of
#         the C floor at c=1 and c=8, with a connection per request);
#       - the same, every notify to one topic routed into another (a busy
#         chat room: at c=8, eight CGI processes posting to one topic and
#         forwarding along its route, each taking the topic's lock; group
#         commit, issue 31, joins only the posts of one process, so this
#         row is what it leaves to the file locks); ab flags some of its
#         answers "failed" (Length): a post whose copy another process's
#         drain made first answers without the copy's "Wrote to" line,
#         so answers differ in length; they are all 200;
#     the CGI figures are taken in BENCH_ROUNDS rounds (default 3), the
#     targets interleaved in each (hello-c, hello-c-static, hello-cgi,
#     pubsub.cgi, then again), and the median is reported, so that a busy
#     moment of a shared machine falls on every target alike;
#       - `pubsub-cgi serve` behind Apache's mod_proxy, configured as in
#         docs/DEPLOY.md section 9 (goal: >= 2,200 at c=1, >= 6,000 at c=8);
#       - `pubsub-cgi serve` directly (goal: >= 15,000 at c=8);
#  2. notify-to-tunnel latency through Apache (the tunnel-latency example:
#     a simple-format tunnel on a fresh journal, then notifies one at a time
#     on a keep-alive connection, each timed until its frame arrives), for
#     pubsub.cgi under Apache and serve behind mod_proxy (goal: p50 <= 5 ms),
#     and serve directly for reference; both posting straight to the journal
#     ("direct") and to a topic routed into it ("routed", a browser's path).
#
# It ends with a table of every figure against its goal, and writes the
# report to bench/results-<date>.txt as well as to stdout. Not a test
# (nothing passes or fails); CI does not run it.
#
#     bench/cgi-bench.sh                 # 2000 notifies per CGI figure, 20000 per serve figure, 300 round trips per latency figure
#     BENCH_N=500 BENCH_SERVE_N=5000 BENCH_LAT_N=100 bench/cgi-bench.sh
#     BENCH_KEEPALIVE=0 bench/cgi-bench.sh   # no ab -k: a new connection per request everywhere
#     BENCH_OUT=/tmp/r.txt bench/cgi-bench.sh
#     BENCH_CGI_ONLY=1 bench/cgi-bench.sh    # only the CGIs: throughput and CPU per request
#     BENCH_ROUNDS=5 bench/cgi-bench.sh      # 5 interleaved rounds per CGI figure (median)
#     BENCH_PUBSUB=/tmp/old-pubsub-cgi bench/cgi-bench.sh   # that binary as pubsub.cgi (before/after runs)
#     BENCH_SERVE=/tmp/old-pubsub-cgi bench/cgi-bench.sh    # that binary as serve (default: the glibc release build)
#
# Connections: clients (browsers, proxies) keep them alive, so ab runs with
# -k (HTTP/1.0 keep-alive) by default; for the targets that are not CGIs a
# second pair of figures with a new connection per request is printed too,
# since there the TCP handshake is a large part of a request's cost.
# Counts: a CGI figure takes 2000 requests (10-30 s); serve answers ten
# times faster, so its figures take 20000 requests: with 2000 they would
# last a fraction of a second and mostly measure ab's start.
#
# CPU per request: the CGIs are also run directly (outside Apache, same
# environment and body as under it) under `perf stat` (task-clock and page
# faults, 300 runs each; hardware counters are not available on every VM),
# under valgrind's callgrind (user-space instructions, exact and
# repeatable; counted up to pubsub.cgi's clone(), which valgrind does not
# follow) and under `strace -f -c` (system calls, execve included), where
# those tools are installed.
#
# Needs: apache2, apache2-utils (ab), installed here with apt-get when
# missing and run as root, and cc (the C floor); optional: perf (linux-perf), valgrind. Run as
# root (Apache workers then run as www-data) or as a user (they run as that
# user). Honors CARGO_TARGET_DIR. Parts that fail to build or start print
# "n/a".
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
N=${BENCH_N:-2000}
SERVE_N=${BENCH_SERVE_N:-$((N * 10))}
LAT_N=${BENCH_LAT_N:-300}
LAT_WARMUP=${BENCH_LAT_WARMUP:-20}
OUT=${BENCH_OUT:-$repo/bench/results-$(date +%Y%m%d-%H%M%S).txt}
CONCURRENCY=(1 8)
ROUNDS=${BENCH_ROUNDS:-3}
BODY='kn_to=/bench/t&kn_payload=hello&kn_response_format=simple'
ROUTED_BODY='kn_to=/bench/room&kn_payload=hello&kn_response_format=simple'
APACHE=/usr/sbin/apache2
MODULES=/usr/lib/apache2/modules
KEEPALIVE=${BENCH_KEEPALIVE:-1}
[ "$KEEPALIVE" = 0 ] && KEEPALIVE=
AB_FLAGS=()
[ -n "$KEEPALIVE" ] && AB_FLAGS=(-k)

CGI_ONLY=${BENCH_CGI_ONLY:-}
[ "$CGI_ONLY" = 0 ] && CGI_ONLY=

if ! command -v "$APACHE" >/dev/null 2>&1 || ! command -v ab >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing apache2 apache2-utils..." >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq apache2 apache2-utils >&2
    fi
fi
for tool in "$APACHE" ab; do
    command -v "$tool" >/dev/null 2>&1 || { echo "missing $tool (apt-get install apache2 apache2-utils)" >&2; exit 1; }
done

echo "building release binaries (CARGO_TARGET_DIR=$target)..." >&2
if ! (cd "$repo" && CARGO_TARGET_DIR=$target cargo build --release --quiet -p kn-cgi --bins --examples); then
    echo "full build failed; trying hello-cgi alone" >&2
    (cd "$repo" && CARGO_TARGET_DIR=$target cargo build --release --quiet -p kn-cgi --bin hello-cgi)
fi
# pubsub-cgi as docs/DEPLOY.md installs it (`cargo build-cgi-musl`:
# static, musl; see .cargo/config.toml), as pubsub.cgi; `serve` runs from
# the glibc build just made, as DEPLOY.md advises. Without the musl
# target, `cargo build-cgi` (static glibc) as pubsub.cgi.
musl_bin=$target/x86_64-unknown-linux-musl/release/pubsub-cgi
if (cd "$repo" && CARGO_TARGET_DIR=$target cargo --quiet build-cgi-musl); then
    cgi_bin=$musl_bin
else
    echo "cargo build-cgi-musl failed (rustup target add x86_64-unknown-linux-musl?); using cargo build-cgi" >&2
    (cd "$repo" && CARGO_TARGET_DIR=$target cargo --quiet build-cgi) || echo "cargo build-cgi failed; using the dynamic pubsub-cgi" >&2
    cgi_bin=$target/release/pubsub-cgi
fi
hello_bin=$target/release/hello-cgi
pubsub_bin=${BENCH_PUBSUB:-$cgi_bin}
serve_bin=${BENCH_SERVE:-$target/release/pubsub-cgi}
latency_bin=$target/release/examples/tunnel-latency
[ -x "$hello_bin" ] || { echo "no $hello_bin" >&2; exit 1; }

work=$(mktemp -d /tmp/kn-bench.XXXXXX)
chmod 755 "$work"
mkdir -p "$work/cgi-bin" "$work/logs" "$work/events"
cp "$hello_bin" "$work/cgi-bin/hello-cgi"
# The C floor, compiled here as an Apache user would.
have_c=
if cc -O2 -o "$work/cgi-bin/hello-c" "$repo/bench/hello-c.c" 2>"$work/logs/cc.log"; then
    have_c=1
    cc -O2 -static -o "$work/cgi-bin/hello-c-static" "$repo/bench/hello-c.c" 2>>"$work/logs/cc.log" || true
else
    echo "cc failed: no C floor" >&2
fi
have_pubsub=
if [ -x "$pubsub_bin" ]; then
    cp "$pubsub_bin" "$work/cgi-bin/pubsub.cgi"
    have_pubsub=1
fi
have_latency=
[ -x "$latency_bin" ] && have_latency=1
printf '%s' "$BODY" >"$work/body"
printf '%s' "$ROUTED_BODY" >"$work/body-routed"

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

# Apache listens on two ports: $port has the CGIs (/hello, /kn), $pport
# forwards /kn to serve as docs/DEPLOY.md section 9 does.
port=$(free_port)
pport=$(free_port)
while [ "$pport" = "$port" ]; do pport=$(free_port); done

# The built-in server: `pubsub-cgi serve`, its public URL the proxy's.
serve_port=
if [ -x "$serve_bin" ] && [ -z "$CGI_ONLY" ]; then
    p=$(free_port)
    "$serve_bin" serve --listen "127.0.0.1:$p" --root "$work/events-serve" \
        --public-url "http://127.0.0.1:$pport/kn" >"$work/logs/serve.log" 2>&1 </dev/null &
    serve_pid=$!
    if wait_port "$p" 5; then
        serve_port=$p
    else
        echo "pubsub-cgi serve did not start:" >&2
        cat "$work/logs/serve.log" >&2
        kill "$serve_pid" 2>/dev/null || true
        serve_pid=
    fi
fi

proxy_conf=
[ -n "$serve_port" ] && proxy_conf="ProxyPass        /kn http://127.0.0.1:$serve_port/kn flushpackets=on
    ProxyPassReverse /kn http://127.0.0.1:$serve_port/kn
    ProxyPreserveHost On"
pubsub_conf=
[ -n "$have_pubsub" ] && pubsub_conf="ScriptAlias /kn $work/cgi-bin/pubsub.cgi"

cat >"$work/conf" <<CONF
ServerRoot /usr/lib/apache2
ServerName 127.0.0.1
Listen 127.0.0.1:$port
Listen 127.0.0.1:$pport
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
# Debian's apache2.conf
Timeout 300
KeepAlive On
MaxKeepAliveRequests 100
KeepAliveTimeout 5
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
<VirtualHost 127.0.0.1:$port>
    SetEnv KN_EVENTS $work/events
    ScriptAlias /hello $work/cgi-bin/hello-cgi
    ScriptAlias /hello-c $work/cgi-bin/hello-c
    ScriptAlias /hello-c-static $work/cgi-bin/hello-c-static
    $pubsub_conf
</VirtualHost>
<VirtualHost 127.0.0.1:$pport>
    $proxy_conf
</VirtualHost>
CONF

"$APACHE" -f "$work/conf" -k start
wait_port "$port" 10 || { echo "apache did not start:" >&2; cat "$work/logs/error.log" >&2; exit 1; }
wait_port "$pport" 5 || true

# ----- throughput --------------------------------------------------------------

# Prints requests/s, or n/a when the target answers nothing useful. Non-2xx
# answers or failures are flagged after the figure.
measure() { # url concurrency count [ab flags...]
    local out rps failed non2xx url=$1 c=$2 n=$3
    shift 3
    out=$(ab -q "$@" -n "$n" -c "$c" -s 30 -p "${MEASURE_BODY:-$work/body}" -T application/x-www-form-urlencoded "$url" 2>&1) || { echo "n/a"; return; }
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

num() { case "$1" in n/a* | "") echo "" ;; *) echo "${1%%(*}" ;; esac; }

ratio() { # value floor
    local a b
    a=$(num "$1") b=$(num "$2")
    [ -z "$a" ] || [ -z "$b" ] && { echo "n/a"; return; }
    awk -v a="$a" -v b="$b" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'
}

declare -A rate
cgi_targets=(hello-c hello-c-static hello pubsub.cgi pubsub.cgi-routed)
targets=("${cgi_targets[@]}" proxied serve)
[ -n "$CGI_ONLY" ] && targets=("${cgi_targets[@]}")
url_of() {
    case "$1" in
        hello) echo "http://127.0.0.1:$port/hello" ;;
        hello-c) [ -n "$have_c" ] && echo "http://127.0.0.1:$port/hello-c" ;;
        hello-c-static) [ -x "$work/cgi-bin/hello-c-static" ] && echo "http://127.0.0.1:$port/hello-c-static" ;;
        pubsub.cgi | pubsub.cgi-routed) [ -n "$have_pubsub" ] && echo "http://127.0.0.1:$port/kn" ;;
        serve) [ -n "$serve_port" ] && echo "http://127.0.0.1:$serve_port/kn" ;;
        proxied) [ -n "$serve_port" ] && echo "http://127.0.0.1:$pport/kn" ;;
    esac
    return 0
}
label() {
    case "$1" in
        hello-c) echo "hello-c (C floor, dynamic)" ;;
        hello-c-static) echo "hello-c-static (C, -static)" ;;
        hello) echo "hello-cgi (Rust)" ;;
        pubsub.cgi) echo "pubsub.cgi under Apache" ;;
        pubsub.cgi-routed) echo "pubsub.cgi, one routed topic" ;;
        serve) echo "serve, direct" ;;
        proxied) echo "serve behind mod_proxy" ;;
        proxied-close) echo "serve behind mod_proxy, no -k" ;;
        serve-close) echo "serve, direct, no -k" ;;
    esac
}

median() { # values... (n/a and flagged ones skipped)
    local v xs=()
    for v in "$@"; do
        v=$(num "$v")
        [ -n "$v" ] && xs+=("$v")
    done
    [ ${#xs[@]} -eq 0 ] && { echo "n/a"; return; }
    printf '%s\n' "${xs[@]}" | sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else printf "%.2f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

body_of() { if [ "$1" = pubsub.cgi-routed ]; then echo "$work/body-routed"; else echo "$work/body"; fi; }

# The routed topic of pubsub.cgi-routed: /bench/room into /bench/archive.
if [ -n "$have_pubsub" ]; then
    printf 'do_method=route&kn_from=/bench/room&kn_to=/bench/archive&kn_response_format=simple' >"$work/route"
    ab -q -n 1 -p "$work/route" -T application/x-www-form-urlencoded "http://127.0.0.1:$port/kn" >/dev/null 2>&1 || echo "the route of pubsub.cgi-routed failed" >&2
fi

started=$(date +%s)
# The CGIs: interleaved rounds, the median of each.
declare -A runs
for c in "${CONCURRENCY[@]}"; do
    for t in "${cgi_targets[@]}"; do
        url=$(url_of "$t")
        [ -n "$url" ] && ab -q "${AB_FLAGS[@]}" -n 50 -c "$c" -p "$(body_of "$t")" -T application/x-www-form-urlencoded "$url" >/dev/null 2>&1 || true
    done
    for ((round = 1; round <= ROUNDS; round++)); do
        for t in "${cgi_targets[@]}"; do
            url=$(url_of "$t")
            [ -z "$url" ] && continue
            echo "throughput: $t at c=$c ($N notifies), round $round of $ROUNDS..." >&2
            r=$(MEASURE_BODY=$(body_of "$t") measure "$url" "$c" "$N" "${AB_FLAGS[@]}")
            runs[$t,$c]="${runs[$t,$c]:-}${runs[$t,$c]:+ }$r"
        done
    done
    for t in "${cgi_targets[@]}"; do
        # shellcheck disable=SC2086
        rate[$t,$c]=$(median ${runs[$t,$c]:-n/a})
    done
done
for t in "${targets[@]}"; do
    case "$t" in hello* | pubsub.cgi*) continue ;; esac
    url=$(url_of "$t")
    for c in "${CONCURRENCY[@]}"; do
        if [ -z "$url" ]; then
            rate[$t,$c]=n/a
            continue
        fi
        # A short warm-up so that process caches and Apache workers are up.
        ab -q "${AB_FLAGS[@]}" -n 50 -c "$c" -p "$work/body" -T application/x-www-form-urlencoded "$url" >/dev/null 2>&1 || true
        n=$N
        case "$t" in proxied | serve) n=$SERVE_N ;; esac
        echo "throughput: $t at c=$c ($n notifies)..." >&2
        rate[$t,$c]=$(measure "$url" "$c" "$n" "${AB_FLAGS[@]}")
        if [ -n "$KEEPALIVE" ]; then
            case "$t" in
                proxied | serve)
                    echo "throughput: $t at c=$c, a connection per request ($n notifies)..." >&2
                    rate[$t-close,$c]=$(measure "$url" "$c" "$n")
                    ;;
            esac
        fi
    done
done

# ----- latency -------------------------------------------------------------------

# lat[target,mode,p50|p90|p99|max]; latency_error[target] when it failed.
declare -A lat latency_error
lat_targets=(pubsub.cgi proxied serve)
[ -n "$CGI_ONLY" ] && lat_targets=()
for t in ${lat_targets[@]+"${lat_targets[@]}"}; do
    url=$(url_of "$t")
    if [ -z "$url" ] || [ -z "$have_latency" ]; then
        latency_error[$t]="not built or not running"
        continue
    fi
    echo "latency: $t ($LAT_N round trips per mode)..." >&2
    if out=$(timeout 120 "$latency_bin" "$url" --count "$LAT_N" --warmup "$LAT_WARMUP" --both 2>&1); then
        while read -r mode _ rest; do
            for kv in $rest; do
                case "$kv" in p50=* | p90=* | p99=* | max=*) lat[$t,$mode,${kv%%=*}]=${kv#*=} ;; esac
            done
        done <<<"$out"
    else
        latency_error[$t]=$(tail -n 1 <<<"$out")
    fi
done
elapsed=$(($(date +%s) - started))

# ----- CPU per request, outside Apache ----------------------------------------------

# One notify as mod_cgid would start it: the same body, the variables a CGI
# reads, a fresh store. perf stat counts the clone()d child too; its runs
# share one standard input, so --pre rewinds it to the body's start before
# each (else every run but the first would read an empty body).
cgi_env=(env -i PATH=/usr/bin:/bin GATEWAY_INTERFACE=CGI/1.1 REQUEST_METHOD=POST
    CONTENT_LENGTH=${#BODY} CONTENT_TYPE=application/x-www-form-urlencoded
    SERVER_NAME=127.0.0.1 SERVER_PORT=$port SERVER_PROTOCOL=HTTP/1.1 SCRIPT_NAME=/kn
    REMOTE_ADDR=127.0.0.1 KN_EVENTS=$work/events-direct)
declare -A cpu
for b in "${cgi_targets[@]}"; do
    bin=$work/cgi-bin/$b
    [ "$b" = hello ] && bin=$work/cgi-bin/hello-cgi
    [ -x "$bin" ] || continue
    "${cgi_env[@]}" "$bin" <"$work/body" >/dev/null 2>&1 || true # the store's first notify
    if command -v perf >/dev/null 2>&1 &&
        out=$("${cgi_env[@]}" perf stat -x, -r 300 --pre "perl -e 'sysseek STDIN, 0, 0 or die'" \
            -e task-clock,page-faults "$bin" <"$work/body" 2>&1 >/dev/null); then
        cpu[$b,ms]=$(awk -F, '$3 == "task-clock" || $3 ~ /^task-clock/ {printf "%.3f", $1}' <<<"$out")
        cpu[$b,faults]=$(awk -F, '$3 ~ /^page-faults/ {print $1}' <<<"$out")
    fi
    if command -v valgrind >/dev/null 2>&1; then
        rm -f "$work"/callgrind.*
        "${cgi_env[@]}" valgrind --tool=callgrind --dump-before=clone --callgrind-out-file="$work/callgrind.%p" \
            "$bin" <"$work/body" >/dev/null 2>&1 || true
        cpu[$b,instr]=$(cat "$work"/callgrind.* 2>/dev/null | awk '/^summary:/ {s += $2} END {if (s) print s}')
    fi
    if command -v strace >/dev/null 2>&1 &&
        out=$("${cgi_env[@]}" strace -f -c -o "$work/strace.out" "$bin" <"$work/body" 2>&1 >/dev/null; cat "$work/strace.out"); then
        cpu[$b,syscalls]=$(awk '$NF == "total" { print $(NF - 2) }' <<<"$out")
    fi
done

# ----- the report ------------------------------------------------------------------

ms() { [ -n "${lat[$1]:-}" ] && echo "${lat[$1]}" || echo "n/a"; }

# goal_row label measured op goal: "op" is >= or <=; ratio is measured/goal.
goal_row() {
    local m verdict r
    m=$(num "$2")
    if [ -z "$m" ]; then
        r=n/a verdict=n/a
    else
        r=$(awk -v a="$m" -v b="$4" 'BEGIN { printf "%.2f", a / b }')
        verdict=$(awk -v a="$m" -v b="$4" -v op="$3" 'BEGIN { ok = (op == ">=") ? a >= b : a <= b; print ok ? "met" : "MISSED" }')
    fi
    printf '%-52s %10s %3s %-6s %6s  %s\n' "$1" "$2" "$3" "$4" "$r" "$verdict"
}

report() {
    local keep="no (a connection per request)"
    [ -n "$KEEPALIVE" ] && keep="yes (ab -k)"
    echo "knpubsub notify benchmark, $(date -u '+%Y-%m-%d %H:%M UTC'); commit $(cd "$repo" && git rev-parse --short HEAD 2>/dev/null || echo '?')$(cd "$repo" && git diff --quiet HEAD -- crates 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "Apache $("$APACHE" -v | sed -n 's/^Server version: //p'), mpm_event + mod_cgid; $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg); took ${elapsed}s"
    echo
    echo "Throughput: notify POSTs over loopback, ab, $N requests per CGI figure (median of $ROUNDS interleaved rounds), $SERVE_N per serve figure; keep-alive: $keep"
    printf '%-34s' "target"
    for c in "${CONCURRENCY[@]}"; do printf '%14s %9s' "req/s c=$c" "vs C"; done
    echo
    local rows=("${targets[@]}")
    [ -n "$KEEPALIVE" ] && rows+=(proxied-close serve-close)
    for t in "${rows[@]}"; do
        printf '%-34s' "$(label "$t")"
        for c in "${CONCURRENCY[@]}"; do
            printf '%14s %9s' "${rate[$t,$c]:-n/a}" "$(ratio "${rate[$t,$c]:-n/a}" "${rate[hello-c,$c]:-n/a}")"
        done
        echo
    done
    if [ "$ROUNDS" -gt 1 ]; then
        echo "each round (req/s, in the order run):"
        for t in "${cgi_targets[@]}"; do
            for c in "${CONCURRENCY[@]}"; do
                printf '  %-32s c=%-2s %s\n' "$(label "$t")" "$c" "${runs[$t,$c]:-n/a}"
            done
        done
    fi
    echo
    echo "CPU per notify, run directly (not under Apache): perf stat, 300 runs (task-clock, page faults);"
    echo "callgrind (user-space instructions, up to pubsub.cgi's clone()); strace -f -c (system calls, execve included)"
    printf '%-34s %14s %12s %14s %9s\n' target "task-clock ms" "page faults" instructions syscalls
    for t in "${cgi_targets[@]}"; do
        [ "$t" = pubsub.cgi-routed ] && continue
        printf '%-34s %14s %12s %14s %9s\n' "$(label "$t")" "${cpu[$t,ms]:-n/a}" "${cpu[$t,faults]:-n/a}" "${cpu[$t,instr]:-n/a}" "${cpu[$t,syscalls]:-n/a}"
    done
    echo
    [ -n "$CGI_ONLY" ] && return
    echo "Notify-to-tunnel latency, ms: $LAT_N round trips per line after $LAT_WARMUP warm-up, one at a time;"
    echo "direct = notify to the journal, routed = notify to a topic routed into it"
    printf '%-28s %-7s %8s %8s %8s %8s\n' target mode p50 p90 p99 max
    for t in ${lat_targets[@]+"${lat_targets[@]}"}; do
        if [ -n "${latency_error[$t]:-}" ]; then
            printf '%-28s %s\n' "$(label "$t")" "n/a: ${latency_error[$t]}"
            continue
        fi
        for mode in direct routed; do
            printf '%-28s %-7s %8s %8s %8s %8s\n' "$(label "$t")" "$mode" \
                "$(ms "$t,$mode,p50")" "$(ms "$t,$mode,p90")" "$(ms "$t,$mode,p99")" "$(ms "$t,$mode,max")"
        done
    done
    echo
    echo "Against the goals (ratio = measured / goal):"
    printf '%-52s %10s %3s %-6s %6s  %s\n' "" measured "" goal ratio ""
    goal_row "pubsub.cgi / hello-c (C floor), c=1" "$(ratio "${rate[pubsub.cgi,1]}" "${rate[hello-c,1]:-n/a}")" ">=" 1.0
    goal_row "pubsub.cgi / hello-c (C floor), c=8" "$(ratio "${rate[pubsub.cgi,8]}" "${rate[hello-c,8]:-n/a}")" ">=" 1.0
    goal_row "pubsub.cgi / hello-c-static, c=8" "$(ratio "${rate[pubsub.cgi,8]}" "${rate[hello-c-static,8]:-n/a}")" ">=" 1.0
    goal_row "pubsub.cgi / hello-cgi (Rust), c=8" "$(ratio "${rate[pubsub.cgi,8]}" "${rate[hello,8]}")" ">=" 1.0
    goal_row "hello-c / pubsub.cgi, task-clock per notify" "$(ratio "${cpu[hello-c,ms]:-n/a}" "${cpu[pubsub.cgi,ms]:-n/a}")" ">=" 1.0
    if [ -n "$CGI_ONLY" ]; then
        :
    else
        goal_row "serve behind mod_proxy, c=1 (req/s)" "${rate[proxied,1]}" ">=" 2200
        goal_row "serve behind mod_proxy, c=8 (req/s)" "${rate[proxied,8]}" ">=" 6000
        goal_row "serve direct, c=8 (req/s)" "${rate[serve,8]}" ">=" 15000
        for t in pubsub.cgi proxied; do
            for mode in direct routed; do
                goal_row "latency p50, $(label "$t"), $mode (ms)" "$(ms "$t,$mode,p50")" "<=" 5
            done
        done
    fi
    local errors
    errors=$(grep -v 'AH00558\|AH00094\|AH00163\|AH00489\|resuming normal\|caught SIG' "$work/logs/error.log" | tail -n 5 || true)
    if [ -n "$errors" ]; then
        echo
        echo "last Apache error log lines:"
        echo "$errors"
    fi
}

mkdir -p "$(dirname "$OUT")"
echo >&2
report | tee "$OUT"
echo >&2
echo "written to $OUT" >&2
exit 0
