#!/usr/bin/env bash
# Scale-out on GlusterFS at the issue's full size (issue 13): the test
# tests/gluster.rs with 2 hosts x 5,000 posts (one ordinary topic, one
# journal, 100 topics), printing its figures: cross-host notify-to-tunnel
# latency (p50/p99), posts/s per host on a replica 3 volume against two
# servers on one local ext4 store in the same run, the SIGKILL and
# brick-restart runs, and what breaks with GlusterFS's default options.
# The default test suite runs the same tests with 200 posts per host.
# KN_GLUSTER_ONLY=several_hosts runs the main test alone (a before/after
# comparison of posts/s needs no more).
#
# Needs root, iproute2, glusterfs-server, glusterfs-client and /dev/fuse
# (.ci/run installs them). It makes a network namespace with 198.18.0.1
# (the benchmarking range), a private glusterd and volumes in a scratch
# directory, and tears everything down at the end, failed or not.
#
#     bench/gluster-bench.sh                  # 5,000 posts per host
#     KN_GLUSTER_POSTS=1000 bench/gluster-bench.sh
#     BENCH_OUT=/tmp/g.txt bench/gluster-bench.sh
#     KN_GLUSTER_ONLY=several_hosts KN_GLUSTER_POSTS=1000 bench/gluster-bench.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}"
export KN_GLUSTER_POSTS="${KN_GLUSTER_POSTS:-5000}"
out="${BENCH_OUT:-bench/gluster-results-$(date -u +%Y%m%d-%H%M).txt}"
{
    echo "# bench/gluster-bench.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), KN_GLUSTER_POSTS=$KN_GLUSTER_POSTS"
    echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
    cargo test --test gluster -- ${KN_GLUSTER_ONLY:-} --include-ignored --nocapture --test-threads 1 2>&1 |
        grep --line-buffered -E '^(latency|volume|local|SIGKILL|brick|routes|defaults|cluster|total|test |kn doctor|     WRONG)' || true
} | tee "$out"
echo "report: $out"
