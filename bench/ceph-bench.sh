#!/usr/bin/env bash
# Scale-out on CephFS (issue 40): tests/ceph.rs at a larger size, printing
# its figures: cross-host notify-to-tunnel latency (p50/p99, direct and
# through a host's relay, and on one host), posts/s of two hosts posting
# at once on the file system against two servers on one local disk in
# the same run, the MDS killed and restarted under load, SIGKILL of a
# writer, presence across hosts, and what two hosts appending with
# O_APPEND lose. The default test suite runs the same test with 200
# posts per host.
#
# Needs root, iproute2, util-linux (nsenter), ceph-mon, ceph-mgr,
# ceph-osd, ceph-mds, ceph-fuse, ceph-common and /dev/fuse (.ci/run
# installs them). The test makes its own network namespaces (198.18.1.0/24,
# the benchmarking range), a single-machine cluster in a scratch
# directory, and tears everything down at the end, failed or not.
#
#     bench/ceph-bench.sh                     # 2,000 posts per host
#     KN_SCALE_POSTS=500 bench/ceph-bench.sh
#     BENCH_OUT=/tmp/c.txt bench/ceph-bench.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}"
export KN_SCALE_POSTS="${KN_SCALE_POSTS:-2000}"
out="${BENCH_OUT:-bench/ceph-results-$(date -u +%Y%m%d-%H%M).txt}"
{
    echo "# bench/ceph-bench.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), KN_SCALE_POSTS=$KN_SCALE_POSTS"
    echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores; $(ceph --version 2>/dev/null | cut -d' ' -f1-3)"
    log=$(mktemp)
    status=0
    cargo test --test ceph -- --nocapture --test-threads 1 >"$log" 2>&1 || status=$?
    grep -E '^(CephFS|latency|pushed|volume|local|two hosts|[0-9]+ journals|MDS|SIGKILL|routes|both joins|x.s leave|y.s leave|total|test |        (ok|WRONG))' "$log" || true
    if [ "$status" != 0 ]; then
        echo "# cargo test failed ($status):"
        tail -30 "$log"
    fi
    rm -f "$log"
} | tee "$out"
echo "report: $out"
