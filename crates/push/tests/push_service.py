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
"error": why}. Tests only, never the product.
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


def main():
    private_key = ec.generate_private_key(ec.SECP256R1())
    public = private_key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    auth_secret = os.urandom(16)
    endpoint = sys.argv[1] if len(sys.argv) > 1 else "https://fcm.googleapis.com/fcm/send/standin"
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
