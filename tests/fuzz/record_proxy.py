#!/usr/bin/env python3
"""tests/fuzz/record_proxy.py: a loopback TCP proxy that records traffic,
for make-seeds.sh: it listens on 127.0.0.1:LISTEN, forwards every
connection to 127.0.0.1:TARGET, and writes each connection's bytes to
OUTDIR/conn-<n>.c2s (client to server) and .s2c (server to client). Stops
on SIGTERM. Usage: record_proxy.py LISTEN TARGET OUTDIR"""
import os
import selectors
import signal
import socket
import sys

listen_port, target_port, outdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.makedirs(outdir, exist_ok=True)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
lsock = socket.socket()
lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lsock.bind(("127.0.0.1", listen_port))
lsock.listen(256)
sel = selectors.DefaultSelector()
sel.register(lsock, selectors.EVENT_READ, None)
count = 0
LIMIT = 1 << 20  # bytes kept per direction


def close_pair(c, s, files):
    for x in (c, s):
        try:
            sel.unregister(x)
        except (KeyError, ValueError):
            pass
        x.close()
    for f in files:
        f.close()


while True:
    for key, _ in sel.select():
        if key.data is None:
            c, _ = lsock.accept()
            s = socket.create_connection(("127.0.0.1", target_port))
            base = os.path.join(outdir, "conn-%04d" % count)
            count += 1
            files = (open(base + ".c2s", "wb"), open(base + ".s2c", "wb"))
            sel.register(c, selectors.EVENT_READ, (s, files[0], c, files))
            sel.register(s, selectors.EVENT_READ, (c, files[1], s, files))
            continue
        peer, rec, me, files = key.data
        try:
            b = me.recv(65536)
        except OSError:
            b = b""
        if not b:
            try:
                peer.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            try:
                sel.unregister(me)
            except (KeyError, ValueError):
                pass
            if not any(k.fileobj is peer for k in sel.get_map().values()):
                close_pair(me, peer, files)
            continue
        if rec.tell() < LIMIT:
            rec.write(b)
            rec.flush()
        try:
            peer.sendall(b)
        except OSError:
            close_pair(me, peer, files)
