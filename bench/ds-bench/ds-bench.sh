#!/usr/bin/env bash
# Durable Streams throughput: `pubsub-cgi serve` against the reference
# server (@durable-streams/server 0.3.7, pinned in package-lock.json) in
# the same run, on the same machine, with the same client (wrk):
#
#   * appends/s: POST of a 100-byte text/plain body, each connection to a
#     stream of its own (wrk -t = -c: one connection per thread);
#   * catch-up reads/s: GET ?offset=-1 of one stream holding 100 appends of
#     100 bytes (a 10 KB body), every connection reading it;
#
# each at concurrency 1 and 8, keep-alive connections, BENCH_SECONDS
# (default 5) per figure. The reference runs in memory (its default) and,
# with BENCH_REF_FILE=1, file-backed too (LMDB + logs, as our store is on
# disk). Prints a table of requests/s and the ratio serve / reference, and
# one of the CPU time each server spent per request (user + system, from
# /proc: the figure a busy shared machine disturbs least). As ceilings,
# the same wrk runs against `serve`'s built-in page (`GET /index.html`,
# 1.2 KB, no store involved) and against nginx answering `return 200`
# (a configuration of its own in a temporary prefix, one worker and
# `worker_processes auto`, stopped at the end): what any server reaches
# through loopback TCP and wrk on this machine, each also given as a
# ratio to the reference's figures. Not a test: nothing passes or fails;
# CI does not run it.
#
#     bench/ds-bench/ds-bench.sh
#     BENCH_SECONDS=10 BENCH_PUBSUB=target/release/pubsub-cgi bench/ds-bench/ds-bench.sh
#
# With BENCH_PUBSUB_BEFORE naming another pubsub-cgi (an older commit's
# release build), it is measured too, in the same run: the table then
# also gives before -> after ratios. BENCH_ROUNDS=n (default 1) measures
# every target n times, the targets taking turns, and reports each
# figure's median: on a busy machine the load swings between figures.
# BENCH_PIN=split runs wrk on CPU 0 and every server on CPU 1 (taskset),
# BENCH_PIN=same all of them on CPU 0.
#
# Needs: wrk, nginx, node 20 and npm, cargo (builds pubsub-cgi --release unless
# BENCH_PUBSUB names a binary).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
secs="${BENCH_SECONDS:-5}"
work="$(mktemp -d /tmp/ds-bench.XXXXXX)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

pubsub="${BENCH_PUBSUB:-}"
if [ -z "$pubsub" ]; then
    (cd "$root" && cargo build --release -q -p kn-cgi)
    pubsub="${CARGO_TARGET_DIR:-$root/target}/release/pubsub-cgi"
fi
(cd "$here" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)

# BENCH_PIN=split: wrk on CPU 0, every server on CPU 1; BENCH_PIN=same:
# all on CPU 0 (taskset); unset: wherever the scheduler puts them.
case "${BENCH_PIN:-}" in
    split) pin_client=(taskset -c 0); pin_server=(taskset -c 1) ;;
    same) pin_client=(taskset -c 0); pin_server=(taskset -c 0) ;;
    "") pin_client=(); pin_server=() ;;
    *) echo "BENCH_PIN is split or same, not '$BENCH_PIN'" >&2; exit 2 ;;
esac

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

# Each sets $base and leaves the server's pid last in $pids.
start_serve() { # [binary]
    local port; port=$(free_port)
    rm -rf "$work/kn_events"
    KN_STREAM_LONG_POLL_MS=500 "${pin_server[@]}" "${1:-$pubsub}" serve --listen "127.0.0.1:$port" --root "$work/kn_events" >"$work/serve.log" 2>&1 &
    pids+=($!); wait_port "$port"; base="http://127.0.0.1:$port"
}
# nginx answering `return 200` (no body, no file, no upstream): what any
# server can reach here through loopback TCP and wrk. $1: worker_processes
# (1 or auto). Its own prefix and configuration in $work, in the
# foreground (daemon off), stopped with the others.
start_nginx() {
    local port; port=$(free_port)
    mkdir -p "$work/nginx-$1/logs"
    cat >"$work/nginx-$1/nginx.conf" <<NGINX
worker_processes $1;
pid $work/nginx-$1/nginx.pid;
error_log $work/nginx-$1/logs/error.log;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $work/nginx-$1/body;
    proxy_temp_path $work/nginx-$1/proxy;
    fastcgi_temp_path $work/nginx-$1/fastcgi;
    uwsgi_temp_path $work/nginx-$1/uwsgi;
    scgi_temp_path $work/nginx-$1/scgi;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$port;
        location / { return 200; }
    }
}
NGINX
    "${pin_server[@]}" nginx -p "$work/nginx-$1" -c "$work/nginx-$1/nginx.conf" -g 'daemon off;' >"$work/nginx-$1/out.log" 2>&1 &
    pids+=($!); wait_port "$port"; base="http://127.0.0.1:$port"
}
start_ref() {
    local port; port=$(free_port)
    (cd "$here" && exec "${pin_server[@]}" node ref-server.mjs "$port" ${1:+"$1"} >"$work/ref-$port.log" 2>&1) &
    pids+=($!); wait_port "$port"; base="http://127.0.0.1:$port"
}

cat >"$work/append.lua" <<'LUA'
local n = 0
function setup(thread) n = n + 1; thread:set("id", n) end
function init(args) path = "/v1/stream/bench-append-" .. os.time() .. "-" .. id end
wrk.method = "POST"
wrk.body = string.rep("x", 100)
wrk.headers["Content-Type"] = "text/plain"
function request() return wrk.format(nil, path) end
LUA

prepare() { # base: the stream the catch-up reads read
    local base=$1
    curl -s -o /dev/null -X PUT -H 'Content-Type: text/plain' "$base/v1/stream/read-me"
    for i in $(seq 100); do
        curl -s -o /dev/null -X POST -H 'Content-Type: text/plain' --data-binary "$(printf '%0100d' "$i")" "$base/v1/stream/read-me"
    done
}

# CPU time (user + system, clock ticks) of the server, the last in $pids,
# and of its children (nginx's workers).
ticks() {
    local p=${pids[-1]}
    # shellcheck disable=SC2046
    cat "/proc/$p/stat" $(pgrep -P "$p" | sed 's|.*|/proc/&/stat|') 2>/dev/null | awk '{ t += $14 + $15 } END { print t }'
}

# "requests/s µs-of-server-CPU-per-request" of a wrk run (its arguments).
measure() {
    local before out
    before=$(ticks)
    out=$("${pin_client[@]}" wrk "$@")
    awk -v t0="$before" -v t1="$(ticks)" -v hz="$(getconf CLK_TCK)" '
        /requests in/ { n = $1 } /Requests\/sec/ { r = $2 }
        END { printf "%s %.1f\n", r, (n > 0 ? (t1 - t0) * 1e6 / hz / n : 0) }' <<<"$out"
}

append_rate() { # base c
    local base=$1 c=$2 stamp
    stamp=$(date +%s)
    # Each wrk thread appends to its own stream: create them first.
    for i in $(seq "$c"); do
        curl -s -o /dev/null -X PUT -H 'Content-Type: text/plain' "$base/v1/stream/bench-append-$stamp-$i"
    done
    measure -t"$c" -c"$c" -d"${secs}s" -s "$work/append.lua" "$base"
}

read_rate() { # base c
    measure -t"$1" -c"$1" -d"${secs}s" "$2/v1/stream/read-me?offset=-1"
}

declare -A rate cpu
targets=(serve ref-memory nginx-1 nginx-auto)
before="${BENCH_PUBSUB_BEFORE:-}"
[ -n "$before" ] && targets=(serve-before "${targets[@]}")
[ "${BENCH_REF_FILE:-0}" = 1 ] && targets+=(ref-file)
rounds="${BENCH_ROUNDS:-1}"
for round in $(seq "$rounds"); do
for t in "${targets[@]}"; do
    if [[ $t = nginx-* ]]; then
        start_nginx "${t#nginx-}"
        for c in 1 8; do
            read -r r u < <(measure -t"$c" -c"$c" -d"${secs}s" "$base/")
            rate[$t,$c]+=" $r"; cpu[$t,$c]+=" $u"
        done
        kill "${pids[-1]}" 2>/dev/null || true
        sleep 0.5
        continue
    fi
    case $t in
        serve) start_serve ;;
        serve-before) start_serve "$before" ;;
        ref-memory) start_ref ;;
        ref-file) mkdir -p "$work/ref-data"; start_ref "$work/ref-data" ;;
    esac
    prepare "$base"
    # The size of what a catch-up read returns, as a check of the workload.
    bytes=$(curl -s "$base/v1/stream/read-me?offset=-1" | wc -c)
    [ "$bytes" = 10000 ] || echo "warning: $t returned $bytes bytes for the catch-up read" >&2
    for c in 1 8; do
        read -r r u < <(append_rate "$base" "$c")
        rate[$t,append,$c]+=" $r"; cpu[$t,append,$c]+=" $u"
        read -r r u < <(read_rate "$c" "$base")
        rate[$t,read,$c]+=" $r"; cpu[$t,read,$c]+=" $u"
        if [ "$t" = serve ]; then
            read -r r u < <(measure -t"$c" -c"$c" -d"${secs}s" "$base/index.html")
            rate[ceiling,$c]+=" $r"; cpu[ceiling,$c]+=" $u"
        fi
    done
    kill "${pids[-1]}" 2>/dev/null || true
    sleep 0.5
done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for k in "${!rate[@]}"; do rate[$k]=$(echo "${rate[$k]}" | median); cpu[$k]=$(echo "${cpu[$k]}" | median); done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
echo
echo "Durable Streams, requests/s ($(date -u '+%Y-%m-%d %H:%M UTC'), $(git -C "$root" rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg), ${secs} s per figure, median of $rounds)"
echo
printf '| workload | c |%s serve | reference (memory) | ratio |%s\n' "$( [ -n "$before" ] && echo ' serve before | ratio before | ratio after/before |')" "$( [ "${BENCH_REF_FILE:-0}" = 1 ] && echo ' reference (file) | ratio |')"
printf '|---|---|%s---|---|---|%s\n' "$( [ -n "$before" ] && echo '---|---|---|')" "$( [ "${BENCH_REF_FILE:-0}" = 1 ] && echo '---|---|')"
for w in append read; do
    for c in 1 8; do
        s=${rate[serve,$w,$c]}; m=${rate[ref-memory,$w,$c]}
        if [ -n "$before" ]; then
            b=${rate[serve-before,$w,$c]}
            line="| $w | $c | $b | $(ratio "$b" "$m") | $(ratio "$s" "$b") | $s | $m | $(ratio "$s" "$m") |"
        else
            line="| $w | $c | $s | $m | $(ratio "$s" "$m") |"
        fi
        if [ "${BENCH_REF_FILE:-0}" = 1 ]; then f=${rate[ref-file,$w,$c]}; line="$line $f | $(ratio "$s" "$f") |"; fi
        echo "$line"
    done
done
echo
echo "Server CPU per request, µs (user + system; median of $rounds)"
echo
printf '| workload | c |%s serve | reference (memory) | ratio reference / serve |%s\n' "$( [ -n "$before" ] && echo ' serve before |')" "$( [ "${BENCH_REF_FILE:-0}" = 1 ] && echo ' reference (file) |')"
printf '|---|---|%s---|---|---|%s\n' "$( [ -n "$before" ] && echo '---|')" "$( [ "${BENCH_REF_FILE:-0}" = 1 ] && echo '---|')"
for w in append read; do
    for c in 1 8; do
        line="| $w | $c |"
        [ -n "$before" ] && line="$line ${cpu[serve-before,$w,$c]} |"
        line="$line ${cpu[serve,$w,$c]} | ${cpu[ref-memory,$w,$c]} | $(ratio "${cpu[ref-memory,$w,$c]}" "${cpu[serve,$w,$c]}") |"
        [ "${BENCH_REF_FILE:-0}" = 1 ] && line="$line ${cpu[ref-file,$w,$c]} |"
        echo "$line"
    done
done
echo
echo "Ceilings: what a server that does (almost) nothing reaches here, median of $rounds"
echo
echo '| c | server | requests/s | CPU µs per request | / reference append | / reference read |'
echo '|---|---|---|---|---|---|'
for c in 1 8; do
    for k in "ceiling,$c:serve GET /index.html (1.2 KB, no store)" "nginx-1,$c:nginx return 200, 1 worker" "nginx-auto,$c:nginx return 200, worker_processes auto"; do
        key=${k%%:*}; name=${k#*:}
        echo "| $c | $name | ${rate[$key]} | ${cpu[$key]} | $(ratio "${rate[$key]}" "${rate[ref-memory,append,$c]}") | $(ratio "${rate[$key]}" "${rate[ref-memory,read,$c]}") |"
    done
done
