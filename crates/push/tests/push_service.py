#!/usr/bin/env python3
"""A stand-in for a browser and its push service, independent of kn-push:
it makes a browser's key pair and subscription, then checks each push
message it is handed the way a push service and the browser would: the
VAPID JWT with PyPI's py_vapid (signature, aud, exp, sub), the body
decrypted with PyPI's http_ece (RFC 8291 aes128gcm).

Used by crates/push/tests/interop.rs over stdin/stdout, one JSON object a
line: it first prints {"subscription": ...}; then for each line
{"endpoint": E, "headers": {...}, "body": base64} it prints
{"ok": true, "plaintext": base64, "claims": {...}} or {"ok": false,
"error": why}.

With --http, it is a push service on 127.0.0.1 (plain http, for the
product's test setting KN_PUSH_TEST_LOOPBACK): it prints
{"subscription": ..., "base": "http://127.0.0.1:PORT"} and answers a POST
to /push/<script> with the statuses the script lists in turn, dash
separated, the last repeated (/push/429-503-201: 429 with Retry-After: 2,
then 503, then 201 for ever); each POST's verdict (as above, with its
path and the status answered) is kept and GET /results returns them all.
With --https CERT KEY, the same over TLS (Python's ssl module) with the
certificate chain CERT and its key KEY: it prints "base":
"https://127.0.0.1:PORT" (tests/tls.rs makes the certificates).

Tests only, never the product.
"""

import base64
import json
import os
import sys
import time

import http_ece
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from py_vapid import jwt as vapid_jwt


def b64u(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def check(private_key, auth_secret, message):
    headers = {k.lower(): v for k, v in message["headers"].items()}
    if headers.get("content-encoding") != "aes128gcm":
        return "Content-Encoding is not aes128gcm"
    if not headers.get("ttl", "").isdigit():
        return "no TTL"
    scheme, _, params = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "vapid":
        return "Authorization is not vapid"
    # RFC 8292 3.1: t and k, comma separated, optional whitespace.
    parts = dict(p.strip().split("=", 1) for p in params.split(","))
    claims = vapid_jwt.decode(parts["t"], parts["k"])
    endpoint = message["endpoint"]
    origin = "/".join(endpoint.split("/")[:3])
    if claims.get("aud") != origin:
        return "aud %r is not %r" % (claims.get("aud"), origin)
    if not (time.time() < claims["exp"] <= time.time() + 24 * 3600 + 60):
        return "exp %r is not within a day" % claims["exp"]
    if not str(claims.get("sub", "")).startswith(("mailto:", "https:")):
        return "sub %r is not a mailto: or https: URL" % claims.get("sub")
    body = base64.b64decode(message["body"])
    if len(body) > 4096:
        return "body of %d bytes is over 4096" % len(body)
    plaintext = http_ece.decrypt(body, private_key=private_key, auth_secret=auth_secret, version="aes128gcm")
    return {"plaintext": base64.b64encode(plaintext).decode(), "claims": claims}


def serve_http(private_key, auth_secret, subscription_keys, tls=None):
    import http.server
    import threading

    results = []
    counts = {}
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            with lock:
                body = json.dumps(results).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            endpoint = "%s://%s%s" % ("https" if tls else "http", self.headers.get("Host"), self.path)
            message = {"endpoint": endpoint, "headers": dict(self.headers.items()), "body": base64.b64encode(body).decode()}
            try:
                verdict = check(private_key, auth_secret, message)
            except Exception as e:
                verdict = "%s: %s" % (type(e).__name__, e)
            script = self.path.rsplit("/", 1)[-1].split("-")
            with lock:
                n = counts.get(self.path, 0)
                counts[self.path] = n + 1
                status = int(script[min(n, len(script) - 1)]) if all(x.isdigit() for x in script) else 201
                entry = {"ok": False, "error": verdict} if isinstance(verdict, str) else dict(ok=True, **verdict)
                entry.update(path=self.path, status=status, headers={k.lower(): v for k, v in self.headers.items()})
                results.append(entry)
            self.send_response(status)
            if status == 429:
                self.send_header("Retry-After", "2")
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    base = "http://127.0.0.1:%d" % server.server_address[1]
    if tls:
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls[0], tls[1])
        server.socket = context.wrap_socket(server.socket, server_side=True)
        base = "https://127.0.0.1:%d" % server.server_address[1]
    print(json.dumps({"subscription": {"endpoint": base + "/push/201", "keys": subscription_keys}, "base": base}), flush=True)
    server.serve_forever()


def main():
    private_key = ec.generate_private_key(ec.SECP256R1())
    public = private_key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    auth_secret = os.urandom(16)
    keys = {"p256dh": b64u(public), "auth": b64u(auth_secret)}
    if sys.argv[1:] == ["--http"]:
        serve_http(private_key, auth_secret, keys)
        return
    if sys.argv[1:2] == ["--https"] and len(sys.argv) == 4:
        serve_http(private_key, auth_secret, keys, tls=(sys.argv[2], sys.argv[3]))
        return
    endpoint = "https://fcm.googleapis.com/fcm/send/standin"
    subscription = {"endpoint": endpoint, "keys": {"p256dh": b64u(public), "auth": b64u(auth_secret)}}
    print(json.dumps({"subscription": subscription}), flush=True)
    for line in sys.stdin:
        try:
            result = check(private_key, auth_secret, json.loads(line))
        except Exception as e:  # any failure is the test's answer, not a crash
            result = "%s: %s" % (type(e).__name__, e)
        if isinstance(result, str):
            print(json.dumps({"ok": False, "error": result}), flush=True)
        else:
            print(json.dumps(dict(ok=True, **result)), flush=True)


if __name__ == "__main__":
    main()
