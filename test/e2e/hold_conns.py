#!/usr/bin/env python3
"""Holds many connections to a TCP service without ever finishing a request:
some silent, some with half a request sent. Each one the service closes is
opened again after --renew seconds, until --seconds have passed or it is
sent SIGTERM; then it prints what it did as JSON. Loopback only: the source addresses must be
127.x.y.z.

Usage: hold_conns.py --port P --count N --seconds S --kind peer|http
                     [--from 127.0.0.2,127.0.0.3] [--renew 0.2]
"""
import argparse
import json
import selectors
import signal
import socket
import struct
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--count", type=int, default=300)
ap.add_argument("--seconds", type=float, default=10)
ap.add_argument("--kind", choices=["peer", "http"], required=True)
ap.add_argument("--from", dest="sources", default="127.0.0.1")
ap.add_argument("--renew", type=float, default=0.2)
a = ap.parse_args()
sources = a.sources.split(",")
assert all(s.startswith("127.") for s in sources), "loopback sources only"

# Half a request of each kind: nothing at all, a few bytes, a head (or a
# frame header) whose rest never comes.
if a.kind == "peer":
    halves = [b"", b"SHN", b"SHNT" + bytes([1, 2, 0, 0]) + struct.pack("<I", 1000) + bytes(8) + b"{\"non"]
else:
    halves = [b"", b"GET /metr", b"GET /metrics HTTP/1.0\r\nUser-Agent: x\r\n"]

sel = selectors.DefaultSelector()
slots = {}  # socket -> slot index
due = {}    # slot index -> when to open it again
opened = closed_by_peer = failed = 0


def open_slot(i):
    global opened, failed
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.bind((sources[i % len(sources)], 0))
        s.connect_ex(("127.0.0.1", a.port))
    except OSError:
        s.close()
        failed += 1
        due[i] = time.time() + a.renew
        return
    opened += 1
    slots[s] = i
    sel.register(s, selectors.EVENT_WRITE)  # writable: connected, send the half


def close_slot(s):
    i = slots.pop(s)
    sel.unregister(s)
    s.close()
    due[i] = time.time() + a.renew


for i in range(a.count):
    open_slot(i)
end = time.time() + a.seconds
stop = False


def on_term(*_):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
while time.time() < end and not stop:
    for key, ev in sel.select(timeout=0.05):
        s = key.fileobj
        if ev & selectors.EVENT_WRITE:
            half = halves[slots[s] % len(halves)]
            try:
                if half:
                    s.send(half)
                sel.modify(s, selectors.EVENT_READ)
            except OSError:
                close_slot(s)
            continue
        try:
            data = s.recv(65536)  # (the peer channel's hello: read and forgotten)
        except BlockingIOError:
            continue
        except OSError:
            data = b""
        if not data:
            closed_by_peer += 1
            close_slot(s)
    now = time.time()
    for i, t in list(due.items()):
        if t <= now:
            del due[i]
            open_slot(i)
held = len(slots)
for s in list(slots):
    s.close()
json.dump({"opened": opened, "closed_by_peer": closed_by_peer, "failed": failed, "held_at_end": held}, sys.stdout)
print()
