#!/usr/bin/env bash
# Makes tests/data/v4-store.tar.gz: an event store written by the current
# release (format version 4, one durable copy per journal), with what the
# release itself says the store holds, for issue 39's upgrade test
# (docs/design/one-copy.md, "Opening a store of today's release"). Run it
# with the binaries of the release whose store it is, never a later one:
#
#     cargo build -p kn-cgi --bin pubsub-cgi -p kn-sensors --bin kn
#     tests/data/make-v4-store.sh                    # target/debug binaries
#     MAKE_PUBSUB=... MAKE_KN=... tests/data/make-v4-store.sh [OUT-DIR]
#
# It starts `pubsub-cgi serve` on a fresh store under the public URL
# http://kn-upgrade.test/kn (also pinned in .names, so that any later
# binary, on any port, takes the routes' destinations for local topics),
# drives it with curl only (the wire protocol, as a client of today does),
# stops it with SIGTERM, and puts in the tarball, beside kn_events/:
#
#  * v4-store.export: `kn export --format simple` of the whole store by
#    the same release: every retained event of every topic (journals,
#    kn_routes and kn_subtopics included) with its kn_route_checkpoint,
#    byte for byte. After an upgrade `kn export` must print the same bytes
#    before anything new is posted;
#  * v4-store.manifest: what the store holds and what the upgrade test
#    checks, one `key value` line each (journals and their last
#    checkpoints, the resume points, which route is deleted, poisoned,
#    filtered or escalating); also written beside the tarball, to read.
#
# The store holds: ordinary topics with superseded, duplicate, expiring and
# expired events and one blob (a payload over KN_BLOB_BYTES, compressible
# so the tarball stays small); routes into journals (plain, with a content
# filter, with do_max_n population, one deleted, one poisoned by a
# delivery into a journal that never existed, one escalating unread events),
# a chain (topic -> topic -> journal), a fan-out of 40 journals (more than
# KN_FORWARD_INLINE: deferred, drained a route at a time), receipts (an
# acknowledgement and an SSE resume), a presence topic once read, a Durable
# Streams stream bound to a topic, and the sweep's files. Extract it with
# `tar -xzmf` (-m: every mtime now, so that no journal is stale and the
# sweep removes nothing at the first start).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
PUBSUB=${MAKE_PUBSUB:-$target/debug/pubsub-cgi}
KN=${MAKE_KN:-$target/debug/kn}
out=${1:-$here}
url=http://kn-upgrade.test/kn
for tool in curl tar "$PUBSUB" "$KN"; do
    command -v "$tool" >/dev/null || { echo "make-v4-store: $tool is needed" >&2; exit 1; }
done

work=$(mktemp -d /tmp/make-v4-store.XXXXXX)
store=$work/kn_events
serve_pid=
cleanup() {
    [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=$((20000 + RANDOM % 20000)); while ! port_free "$port"; do port=$((20000 + RANDOM % 20000)); done
base=http://127.0.0.1:$port/kn

mkdir -p "$store"
"$KN" names --root "$store" add "$url" >/dev/null
# Short tunnels and receipts written at once: the store is made in seconds.
KN_RECEIPTS_FLUSH_MS=0 "$PUBSUB" serve --listen "127.0.0.1:$port" --root "$store" --public-url "$url" >"$work/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 200); do port_free "$port" || break; sleep 0.05; done

# post TOPIC PARAM... : one form POST; fails unless 200.
post() {
    local topic=$1; shift
    local args=() status
    for p in "$@"; do args+=(--data-urlencode "$p"); done
    status=$(curl -s -o "$work/last" -w '%{http_code}' "${args[@]}" --data-urlencode kn_response_format=simple "$base$topic")
    [ "$status" = 200 ] || { echo "make-v4-store: POST $topic $* answered $status:" >&2; cat "$work/last" >&2; exit 1; }
}
# tunnel JOURNAL [LAST-EVENT-ID]: an SSE tunnel held for a moment (creates
# the journal, refreshes its heartbeat, sends what is new, writes receipts).
tunnel() {
    local extra=()
    [ $# -gt 1 ] && extra=(-H "Last-Event-ID: $2")
    curl -s -N --max-time 1 "${extra[@]}" "$base$1?do_method=route&kn_response_format=sse" >/dev/null || true
}

# --- journals, each opened once by a tunnel, as a browser page does.
for j in /who/anna/kn_journal /who/bob/kn_journal /who/carl/s/1/kn_journal /who/dora/kn_journal; do tunnel "$j"; done
for i in $(seq 0 39); do tunnel "/who/room/$i/kn_journal"; done

# --- routes
post /what/chat do_method=route kn_from=/what/chat kn_to=/who/anna/kn_journal kn_id=r-anna
post /what/chat do_method=route kn_from=/what/chat kn_to=/who/bob/kn_journal kn_id=r-bob kn_content_filter=urgent
post /what/chat do_method=route kn_from=/what/chat kn_to=/what/archive kn_id=r-archive
post /what/archive do_method=route kn_from=/what/archive kn_to=/who/carl/s/1/kn_journal kn_id=r-carl
post /what/chat do_method=route kn_from=/what/chat kn_to=/who/dora/kn_journal kn_id=r-dora kn_unread_after=3600 kn_unread_to=/what/unread
post /what/chat do_method=route kn_from=/what/chat kn_to=/who/ghost/kn_journal kn_id=r-ghost
for i in $(seq 0 39); do
    post /what/room do_method=route kn_from=/what/room "kn_to=/who/room/$i/kn_journal" "kn_id=r-room-$i"
done

# --- events on /what/chat (each delivered to anna, archive -> carl, dora;
# to bob when it matches urgent; the ghost route is poisoned by the first)
post /what/chat do_method=notify kn_id=c1 kn_payload=hello
post /what/chat do_method=notify kn_id=c2 "kn_payload=urgent: the first"
post /what/chat do_method=notify kn_id=c3 kn_payload=three
post /what/chat do_method=notify kn_id=c3 kn_payload=three-again          # supersedes c3
post /what/chat do_method=notify kn_id=c3 kn_payload=three-again          # a duplicate: not stored
post /what/chat do_method=notify kn_id=c4 kn_payload=until-later kn_expires=+86400
post /what/chat do_method=notify kn_id=c5 kn_payload=gone kn_expires=1000000000  # expired: stored, never delivered
big=$(head -c 70000 /dev/zero | tr '\0' 'k')                                  # over KN_BLOB_BYTES: a blob
post /what/chat do_method=notify kn_id=c6 "kn_payload=$big"
post /what/news do_method=notify kn_id=n1 kn_payload=news-one
post /what/news do_method=notify kn_id=n2 kn_payload=news-two
post /what/news do_method=notify kn_id=n3 kn_payload=news-three
# a route with a population (the newest 2 of /what/news) into carl
post /what/news do_method=route kn_from=/what/news kn_to=/who/carl/s/1/kn_journal kn_id=r-news do_max_n=2
# bob's route deleted: the next events do not reach bob
post /what/chat do_method=route kn_from=/what/chat kn_to= kn_id=r-bob
post /what/chat do_method=notify kn_id=c7 "kn_payload=urgent: after bob left"
# the fan-out: deferred drains, a route at a time
for k in 1 2 3; do post /what/room do_method=notify "kn_id=m$k" "kn_payload=room message $k"; done
sleep 1

# --- receipts: anna acknowledges her second event; dora resumes by SSE
post /what/chat do_method=ack kn_from=/who/anna/kn_journal kn_route_checkpoint=2
tunnel /who/dora/kn_journal 1
# presence, once read (its pass posts the joins)
curl -s -o /dev/null --max-time 2 "$base/what/room/kn_presence?kn_response_format=simple" || true
# a Durable Streams stream bound to /what/chat, read once (imports c1..c7)
curl -s -o /dev/null --max-time 5 -X PUT -H 'Content-Type: application/json' -H 'Kn-Topic: /what/chat' "http://127.0.0.1:$port/v1/stream/rooms/chat"
curl -s -o /dev/null --max-time 5 "http://127.0.0.1:$port/v1/stream/rooms/chat?offset=-1"
# every journal's tunnel once more, so each has .receipts and a fresh heartbeat
for j in /who/anna/kn_journal /who/bob/kn_journal /who/carl/s/1/kn_journal; do tunnel "$j"; done
sleep 1

kill -TERM "$serve_pid"
wait "$serve_pid" 2>/dev/null || true
serve_pid=

# --- what the upgrade test checks
"$KN" export --root "$store" --format simple >"$work/v4-store.export"
{
    echo "# made by tests/data/make-v4-store.sh at $(date -u +%FT%TZ) from $(cd "$repo" && git rev-parse --short HEAD 2>/dev/null || echo ?)"
    echo "public_url $url"
    for j in /who/anna/kn_journal /who/bob/kn_journal /who/carl/s/1/kn_journal /who/dora/kn_journal /who/room/0/kn_journal /who/room/39/kn_journal; do
        last=$("$KN" events --root "$store" "$j" | sed -n 's/^kn_route_checkpoint[:=] *//p' | tail -1)
        echo "journal $j ${last:-0}"
    done
    echo "resume /who/anna/kn_journal 2"
    echo "resume /who/carl/s/1/kn_journal 1"
    echo "route_deleted /what/chat r-bob"
    echo "route_poisoned /what/chat r-ghost"
    echo "route_filtered /what/chat r-bob urgent"
    echo "route_unread /what/chat r-dora /what/unread"
    echo "fanout /what/room 40"
    echo "stream /v1/stream/rooms/chat /what/chat"
} >"$work/v4-store.manifest"
cp "$work/v4-store.manifest" "$out/v4-store.manifest"
tar -C "$work" --sort=name --owner=0 --group=0 --numeric-owner -S -czf "$out/v4-store.tar.gz" kn_events v4-store.export v4-store.manifest
ls -l "$out/v4-store.tar.gz" "$out/v4-store.manifest"
