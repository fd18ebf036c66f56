#!/usr/bin/env python3
"""Fan-out over WebSocket beside SSE (and Nchan's WebSocket subscribers):
one publisher, N subscribers, E events; deliveries/s and the server's CPU
time per delivery (user + system from /proc, all of the server's
processes), which the client's own speed does not disturb.

    bench/ws-fanout.py --serve target/release/pubsub-cgi [--n 1000] [--events 50]
                       [--nchan-port PORT] [--hold N] [--only serve-ws-raw,serve-sse]

With --hold N it measures memory instead: serve's RSS growth while it
holds N subscribers of each kind (a WebSocket, an `sse` tunnel; each with
its journal and route), read --settle seconds (6) after all are open
(serve gives the pages malloc holds free back every 5 s), per held
subscriber.

For serve each subscriber is the PubSub protocol's: a tunnel on a journal
of its own (a WebSocket, or an `sse` tunnel read raw) and a route into it
from /what/bench, so each delivery is an append to a journal on disk; for
Nchan a WebSocket on the channel, in memory. The client is Python's
`websockets` (asyncio), one process: the deliveries/s it sees are bounded
by it; the CPU per delivery is the server's own. Called by bench/vs-nchan
(the WebSocket row) or alone.
"""

import argparse
import asyncio
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

import websockets

TOPIC = "/what/bench"
# A channel of Nchan's own for this run: a used one would replay its last
# messages to new subscribers.
CHANNEL = f"ws{os.getpid()}"


def cpu_ticks(pids):
    total = 0
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total


async def http(addr, method, path, body=b""):
    host, port = addr.split(":")
    r, w = await asyncio.open_connection(host, int(port))
    w.write(f"{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    await w.drain()
    data = await r.read()
    w.close()
    return data


async def sse_subscriber(addr, i, ready, counts):
    host, port = addr.split(":")
    r, w = await asyncio.open_connection(host, int(port))
    journal = f"/who/b{i}/kn_journal"
    w.write(f"GET /kn{journal}?do_method=route&kn_response_format=sse HTTP/1.1\r\nHost: {addr}\r\n\r\n".encode())
    await w.drain()
    await r.readuntil(b"Watching topic")
    await http(addr, "POST", "/kn", f"do_method=route&kn_from=%2Fwhat%2Fbench&kn_to={journal.replace('/', '%2F')}&kn_response_format=simple".encode())
    ready.release()
    while True:
        line = await r.readline()
        if not line:
            return
        if b'"kn_payload":"ev' in line:
            counts[0] += 1


async def ws_subscriber(url_of, i, ready, counts, route):
    ws = await websockets.connect(url_of(i), ping_interval=None, max_size=2**22)
    if route:
        # serve: the "200 Watching topic" status, then the route's answer.
        await ws.recv()
        await ws.send(route(i))
        await ws.recv()
    ready.release()
    async for text in ws:
        if '"ev' in text or text.startswith("ev"):
            counts[0] += 1


async def raw_ws_subscriber(addr, path, i, ready, counts, route, needle):
    """A WebSocket read raw (the handshake, then the bytes counted for
    `needle`): a client as fast as the SSE one, so that neither server is
    held back by the client's own frame parsing."""
    host, port = addr.split(":")
    r, w = await asyncio.open_connection(host, int(port))
    w.write(f"GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    await w.drain()
    await r.readuntil(b"\r\n\r\n")
    if route:
        await r.readuntil(b"Watching topic")
        payload = route(i).encode()
        # A client's frame is masked (RFC 6455 5.3); a zero mask keeps it readable.
        w.write(bytes([0x81, 0x80 | len(payload)]) + b"\0\0\0\0" + payload if len(payload) < 126 else
                bytes([0x81, 0x80 | 126]) + len(payload).to_bytes(2, "big") + b"\0\0\0\0" + payload)
        await w.drain()
        await r.readuntil(b"kn_in_reply_to")
    ready.release()
    carry = b""
    while True:
        data = await r.read(65536)
        if not data:
            return
        data = carry + data
        counts[0] += data.count(needle)
        carry = data[-(len(needle) - 1):]


async def run(kind, addr, n, events, pids, publish, counting=False):
    counts = [0]
    ready = asyncio.Semaphore(0)
    route = lambda i: f"do_method=route&kn_from=%2Fwhat%2Fbench&kn_to=%2Fwho%2Fb{i}%2Fkn_journal&kn_id=r{i}"
    if kind == "serve-ws":
        url_of = lambda i: f"ws://{addr}/kn/who/b{i}/kn_journal?do_method=route&kn_response_format=websocket"
        make = lambda i: ws_subscriber(url_of, i, ready, counts, route)
    elif kind == "serve-ws-raw":
        make = lambda i: raw_ws_subscriber(addr, f"/kn/who/b{i}/kn_journal?do_method=route&kn_response_format=websocket", i, ready, counts, route, b'"kn_payload":"ev')
    elif kind == "serve-sse":
        make = lambda i: sse_subscriber(addr, i, ready, counts)
    elif kind == "nchan-ws":
        make = lambda i: ws_subscriber(lambda i: f"ws://{addr}/sub/{CHANNEL}", i, ready, counts, None)
    else:
        make = lambda i: raw_ws_subscriber(addr, f"/sub/{CHANNEL}", i, ready, counts, None, b"ev")
    tasks = []
    for start in range(0, n, 50):
        tasks += [asyncio.create_task(make(start + j)) for j in range(min(50, n - start))]
        for _ in range(min(50, n - start)):
            await ready.acquire()
    await asyncio.sleep(1)
    counts[0] = 0
    want = n * events
    if counting:
        subprocess.run(["callgrind_control", "-i", "on", str(pids[0])], stdout=subprocess.DEVNULL, check=True)
    before = cpu_ticks(pids)
    t0 = time.monotonic()
    for e in range(events):
        await publish(e)
    while counts[0] < want and time.monotonic() - t0 < 600:
        await asyncio.sleep(0.01)
    took = time.monotonic() - t0
    used = (cpu_ticks(pids) - before) / os.sysconf("SC_CLK_TCK")
    if counting:
        subprocess.run(["callgrind_control", "-i", "off", str(pids[0])], stdout=subprocess.DEVNULL, check=True)
    for t in tasks:
        t.cancel()
    got = counts[0]
    print(f"{kind:12} {n} subscribers x {events} events: {got}/{want} delivered in {took:.2f} s = {got / took:,.0f} deliveries/s, "
          f"server CPU {used * 1e6 / max(got, 1):.1f} us per delivery", flush=True)


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def hold(kind, binary, n, settle):
    """serve's RSS growth per held subscriber of `kind`."""
    with tempfile.TemporaryDirectory() as root:
        p, addr = start_serve(binary, root)
        counts = [0]
        ready = asyncio.Semaphore(0)
        route = lambda i: f"do_method=route&kn_from=%2Fwhat%2Fbench&kn_to=%2Fwho%2Fb{i}%2Fkn_journal&kn_id=r{i}"
        if kind == "serve-ws-raw":
            make = lambda i: raw_ws_subscriber(addr, f"/kn/who/b{i}/kn_journal?do_method=route&kn_response_format=websocket", i, ready, counts, route, b'"kn_payload":"ev')
        else:
            make = lambda i: sse_subscriber(addr, i, ready, counts)
        # One subscriber opened and settled first, so that what every
        # server allocates once (its pools, caches) is in the baseline.
        warm = [asyncio.create_task(make(n))]
        await ready.acquire()
        await asyncio.sleep(settle)
        base = rss_kib(p.pid)
        tasks = []
        for start in range(0, n, 50):
            tasks += [asyncio.create_task(make(start + j)) for j in range(min(50, n - start))]
            for _ in range(min(50, n - start)):
                await ready.acquire()
        await asyncio.sleep(settle)
        held = rss_kib(p.pid)
        print(f"{kind:12} holding {n}: RSS {base / 1024:.1f} -> {held / 1024:.1f} MiB, "
              f"{(held - base) * 1024 / n / 1000:.2f} KB per held subscriber", flush=True)
        for t in tasks + warm:
            t.cancel()
        p.kill()
        p.wait()


def start_serve(binary, root, callgrind=None):
    # Under callgrind (--callgrind FILE), counting only while the events
    # are published (callgrind_control -i on / off around them).
    wrap = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={callgrind}"] if callgrind else []
    p = subprocess.Popen(wrap + [binary, "serve", "--listen", "127.0.0.1:0", "--root", root, "--max-connections", "20000"],
                         stdout=subprocess.PIPE, text=True)
    # The first line naming the URL (a wrapper such as heaptrack may
    # print lines of its own before it).
    for line in p.stdout:
        found = re.search(r"http://([^/]+)/kn", line)
        if found:
            return p, found.group(1)
    sys.exit(f"ws-fanout: {binary} printed no URL")


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", required=True)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--events", type=int, default=50)
    ap.add_argument("--nchan-port", type=int)
    ap.add_argument("--nchan-pids", default="")
    ap.add_argument("--hold", type=int, default=0)
    ap.add_argument("--settle", type=float, default=6.0)
    ap.add_argument("--only", default="serve-ws-raw,serve-ws,serve-sse")
    ap.add_argument("--callgrind", action="store_true", help="serve under valgrind's callgrind: instructions per delivery (slow: use a small --n)")
    ap.add_argument("--callgrind-keep", metavar="PREFIX", help="keep callgrind's output as PREFIX.<kind> (for callgrind_annotate)")
    args = ap.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    kinds = [k for k in args.only.split(",") if k]
    if args.hold:
        for kind in kinds:
            await hold(kind, args.serve, args.hold, args.settle)
        return
    for kind in kinds:
        with tempfile.TemporaryDirectory() as root:
            out = f"{root}/callgrind.out" if args.callgrind else None
            p, addr = start_serve(args.serve, root, out)
            publish = lambda e, addr=addr: http(addr, "POST", "/kn", f"kn_to=%2Fwhat%2Fbench&kn_payload=ev{e}&kn_response_format=simple".encode())
            await run(kind, addr, args.n, args.events, [p.pid], publish, counting=bool(out))
            if out:
                # The counts are written as serve exits (SIGTERM).
                p.terminate()
                p.wait()
                totals = [l for l in open(out) if l.startswith(("summary:", "totals:"))]
                ir = int(totals[-1].split()[1])
                if args.callgrind_keep:
                    os.replace(out, f"{args.callgrind_keep}.{kind}")
                print(f"{kind:12} callgrind: {ir:,} instructions while publishing = {ir / (args.n * args.events):,.0f} per delivery", flush=True)
                continue
            p.kill()
            p.wait()
    if args.nchan_port:
        addr = f"127.0.0.1:{args.nchan_port}"
        pids = [int(x) for x in args.nchan_pids.split(",") if x]
        publish = lambda e: http(addr, "POST", f"/pub/{CHANNEL}", f"ev{e}".encode())
        for kind in ["nchan-ws-raw", "nchan-ws"]:
            await run(kind, addr, args.n, args.events, pids, publish)


if __name__ == "__main__":
    asyncio.run(main())
