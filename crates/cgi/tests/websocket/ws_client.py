#!/usr/bin/env python3
"""An independent WebSocket client for crates/cgi/tests/websocket.rs: the
PyPI `websockets` library (not our code) against `pubsub-cgi serve`.

Opens URL, sends each --send frame once the socket is open, and prints one
JSON line per thing that happens:

    {"open": true, "subprotocol": "kn"}
    {"refused": 403, "body": "..."}            the handshake was answered
    {"frame": {...the server's JSON object...}}
    {"closed": 4403, "reason": "..."}
    {"timeout": true}

It stops once every --until text was seen in some frame (in any order),
at the close, or after --timeout seconds. With --silent it reads nothing
(a slow reader, which answers no ping either) until a line arrives on its
stdin, then reads to the close and prints {"count": N, "closed": code}.
"""

import argparse
import asyncio
import json
import sys

import websockets


def say(thing):
    print(json.dumps(thing), flush=True)


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--protocol", action="append", default=[])
    ap.add_argument("--header", action="append", default=[], help="Name: value")
    ap.add_argument("--origin")
    ap.add_argument("--send", action="append", default=[])
    ap.add_argument("--until", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--max-size", type=int, default=2**24)
    ap.add_argument("--silent", action="store_true")
    args = ap.parse_args()

    headers = []
    for h in args.header:
        name, _, value = h.partition(":")
        headers.append((name.strip(), value.strip()))
    if args.origin:
        headers.append(("Origin", args.origin))
    try:
        ws = await websockets.connect(
            args.url,
            subprotocols=args.protocol or None,
            additional_headers=headers,
            max_size=args.max_size,
            ping_interval=None,
            open_timeout=args.timeout,
        )
    except websockets.InvalidStatus as e:
        say({"refused": e.response.status_code, "body": e.response.body.decode("utf-8", "replace")})
        return
    say({"open": True, "subprotocol": ws.subprotocol})
    for frame in args.send:
        await ws.send(frame)
    if args.silent:
        # Read nothing (no frame, no ping answered) until a line on stdin,
        # then read what is there, to the close.
        ws.transport.pause_reading()
        say({"paused": True})
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        ws.transport.resume_reading()
        count = 0
        try:
            async with asyncio.timeout(args.timeout):
                async for _ in ws:
                    count += 1
        except TimeoutError:
            say({"timeout": True, "count": count})
            return
        except websockets.ConnectionClosed:
            pass
        say({"count": count, "closed": ws.close_code, "reason": ws.close_reason})
        return
    wanted = set(args.until)
    try:
        async with asyncio.timeout(args.timeout):
            async for text in ws:
                say({"frame": json.loads(text)})
                wanted = {w for w in wanted if w not in text}
                if args.until and not wanted:
                    await ws.close()
                    return
    except TimeoutError:
        say({"timeout": True})
        return
    except websockets.ConnectionClosed:
        pass
    say({"closed": ws.close_code, "reason": ws.close_reason})


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
