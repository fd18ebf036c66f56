#!/usr/bin/env python3
"""Fan-out over WebSocket beside SSE (and Nchan's WebSocket subscribers):
one publisher, N subscribers, E events; deliveries/s and the server's CPU
time per delivery (user + system from /proc, all of the server's
processes), which the client's own speed does not disturb.

    bench/ws-fanout.py --serve target/release/pubsub-cgi [--n 1000] [--events 50]
                       [--nchan-port PORT]

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


async def run(kind, addr, n, events, pids, publish):
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
    before = cpu_ticks(pids)
    t0 = time.monotonic()
    for e in range(events):
        await publish(e)
    while counts[0] < want and time.monotonic() - t0 < 120:
        await asyncio.sleep(0.01)
    took = time.monotonic() - t0
    used = (cpu_ticks(pids) - before) / os.sysconf("SC_CLK_TCK")
    for t in tasks:
        t.cancel()
    got = counts[0]
    print(f"{kind:12} {n} subscribers x {events} events: {got}/{want} delivered in {took:.2f} s = {got / took:,.0f} deliveries/s, "
          f"server CPU {used * 1e6 / max(got, 1):.1f} us per delivery", flush=True)


def start_serve(binary, root):
    p = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--root", root, "--max-connections", "20000"],
                         stdout=subprocess.PIPE, text=True)
    addr = re.search(r"http://([^/]+)/kn", p.stdout.readline()).group(1)
    return p, addr


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", required=True)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--events", type=int, default=50)
    ap.add_argument("--nchan-port", type=int)
    ap.add_argument("--nchan-pids", default="")
    args = ap.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    for kind in ["serve-ws-raw", "serve-ws", "serve-sse"]:
        with tempfile.TemporaryDirectory() as root:
            p, addr = start_serve(args.serve, root)
            publish = lambda e, addr=addr: http(addr, "POST", "/kn", f"kn_to=%2Fwhat%2Fbench&kn_payload=ev{e}&kn_response_format=simple".encode())
            await run(kind, addr, args.n, args.events, [p.pid], publish)
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
