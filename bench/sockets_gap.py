#!/usr/bin/python3
"""One TCP stream and the longest pause in its delivery.

  sockets_gap.py recv PORT SECONDS      prints: max_gap_s=G bytes=B after=T
  sockets_gap.py send ADDR PORT SECONDS
  sockets_gap.py echo PORT SECONDS      (request/response: echoes 4 KiB messages)
  sockets_gap.py ping ADDR PORT SECONDS prints: max_rtt_s=R rounds=N after=T

The receiver reports the longest time without a byte arriving after the
first second (the fault comes later; a pause still going at the end counts
to the end), and when it began.
"""
import socket
import sys
import time

def accept_one(port):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(1)
    c, _ = ls.accept()
    return c


def recv_exact(c, n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d:
            raise EOFError
        b += d
    return b


if sys.argv[1] == "echo":
    port, secs = int(sys.argv[2]), float(sys.argv[3])
    c = accept_one(port)
    c.settimeout(secs + 5)
    try:
        while True:
            c.sendall(recv_exact(c, 4096))
    except (EOFError, OSError):
        pass
elif sys.argv[1] == "ping":
    addr, port, secs = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    s = socket.create_connection((addr, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(secs)
    msg = b"p" * 4096
    start = time.monotonic()
    worst, at, n = 0.0, 0.0, 0
    try:
        while time.monotonic() - start < secs:
            t = time.monotonic()
            s.sendall(msg)
            recv_exact(s, 4096)
            d = time.monotonic() - t
            if t - start > 1 and d > worst:
                worst, at = d, t - start
            n += 1
            time.sleep(0.002)
    except (OSError, EOFError):
        worst, at = time.monotonic() - t, t - start
    print(f"max_rtt_s={worst:.3f} rounds={n} after={at:.1f}", flush=True)
elif sys.argv[1] == "recv":
    port, secs = int(sys.argv[2]), float(sys.argv[3])
    c = accept_one(port)
    c.settimeout(1.0)
    start = last = time.monotonic()
    gap, at, total = 0.0, 0.0, 0
    while time.monotonic() - start < secs:
        try:
            n = len(c.recv(1 << 16))
        except socket.timeout:
            continue
        if n == 0:
            break
        now = time.monotonic()
        if now - start > 1 and now - last > gap:
            gap, at = now - last, last - start
        last = now
        total += n
    end = time.monotonic()
    if end - last > gap:  # a pause that never ended counts to the end
        gap, at = end - last, last - start
    print(f"max_gap_s={gap:.3f} bytes={total} after={at:.1f}", flush=True)
else:
    addr, port, secs = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    s = socket.create_connection((addr, port))
    s.settimeout(0.5)  # a stuck send must not outlive the run
    buf = b"x" * (1 << 16)
    start = time.monotonic()
    try:
        while time.monotonic() - start < secs:
            try:
                s.send(buf)
            except socket.timeout:
                pass
    except OSError:
        pass
