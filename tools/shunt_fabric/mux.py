"""The mux (shunt-fabric _mux, one per guest): shares the one connection
to a guest's agent among any number of exec clients."""
import json
import os
import selectors
import socket
import sys
import time

from .state import State


def cmd_mux(a):
    """Holds the one connection to a guest's virtio-serial port and lets
    many exec clients share it, each command under its own id."""
    st = State(a.name)
    host = a.host
    guest = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    for _ in range(300):
        try:
            guest.connect(st.path(host + ".agent"))
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit("mux: no agent socket")
    lpath = st.path(host + ".exec")
    try:
        os.unlink(lpath)
    except OSError:
        pass
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(lpath)
    lsock.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(guest, selectors.EVENT_READ, "guest")
    sel.register(lsock, selectors.EVENT_READ, "listen")
    guest.sendall(b'{"op": "ping", "id": 0}\n')
    ready = False
    pending = []            # requests waiting for the agent
    clients = {}            # id -> socket
    inbuf = {}              # socket -> bytes (until its request line)
    gbuf = b""
    next_id = 1

    def drop(c, kill):
        for jid, cs in list(clients.items()):
            if cs is c:
                del clients[jid]
                if kill:
                    guest.sendall(json.dumps({"op": "kill", "id": jid, "sig": 9}).encode() + b"\n")
        try:
            sel.unregister(c)
        except (KeyError, ValueError):
            pass
        inbuf.pop(c, None)
        c.close()

    while True:
        for key, _ in sel.select():
            if key.data == "listen":
                c, _ = lsock.accept()
                inbuf[c] = b""
                sel.register(c, selectors.EVENT_READ, "client")
            elif key.data == "guest":
                data = guest.recv(65536)
                if not data:
                    sys.exit(0)     # qemu went away
                gbuf += data
                while b"\n" in gbuf:
                    line, gbuf = gbuf.split(b"\n", 1)
                    try:
                        m = json.loads(line)
                    except ValueError:
                        continue
                    if "ready" in m or "pong" in m:
                        if not ready:
                            ready = True
                            for p in pending:
                                guest.sendall(p)
                            pending = []
                        continue
                    c = clients.get(m.get("id"))
                    if c is None:
                        continue
                    try:
                        c.sendall(line + b"\n")
                    except OSError:
                        drop(c, True)
                        continue
                    if "exit" in m:
                        drop(c, False)
            else:
                c = key.fileobj
                try:
                    data = c.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    drop(c, True)
                    continue
                if c not in inbuf:
                    continue
                inbuf[c] += data
                if b"\n" in inbuf[c]:
                    line = inbuf.pop(c).split(b"\n", 1)[0]
                    try:
                        req = json.loads(line)
                    except ValueError:
                        drop(c, False)
                        continue
                    req["id"] = next_id
                    clients[next_id] = c
                    next_id += 1
                    msg = json.dumps(req).encode() + b"\n"
                    if ready:
                        guest.sendall(msg)
                    else:
                        pending.append(msg)
