#!/usr/bin/env python3
"""What one idle TLS client costs stockgate: file descriptors and memory.

    python3 benches/tls_idle.py [BIN ...]     # default: target/release/stockgate

For each binary given (e.g. a build of an earlier commit beside this one):
starts a throwaway redis-server (standalone, on 127.0.0.1, in a temp dir),
makes a CA and a server certificate with `openssl`, starts `BIN serve`
with --tls-cert/--tls-key on a free loopback port, then opens CONNECTIONS
(default 1000) TLS connections with Python's own ssl module, each one
handshaken and sent a PING (answered +PONG) and then left idle. It reads
the process's descriptors (/proc/<pid>/fd) and resident memory (VmRSS)
before and after, and prints both per connection. Everything it started
is stopped at the end.

Needs redis-server and openssl (deploy/install-deps.sh dev; openssl is
in Debian's base). Resident memory moves with the allocator's moods:
compare binaries within one run, and read descriptors as exact.
"""
import os
import pathlib
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONNECTIONS = int(os.environ.get("CONNECTIONS", "1000"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def openssl(work, *args):
    subprocess.run(["openssl", *args], cwd=work, check=True, capture_output=True)


def certificates(work):
    openssl(work, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=bench ca")
    (work / "server.cnf").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    openssl(work, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    openssl(work, "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "server.cnf")


def wait_port(port, proc, what):
    for _ in range(200):
        if proc.poll() is not None:
            sys.exit(f"{what} exited: {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not listen on {port}")


def wait_ready(admin):
    for _ in range(300):
        try:
            with socket.create_connection(("127.0.0.1", admin), timeout=0.5) as s:
                s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    sys.exit("stockgate did not become ready")


def footprint(pid):
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    rss = 0
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return fds, rss


def measure(binary, work, redis_port):
    port, admin = free_port(), free_port()
    gate = subprocess.Popen(
        [binary, "serve", "--upstream", f"redis://127.0.0.1:{redis_port}",
         "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
         "--tls-cert", str(work / "server.crt"), "--tls-key", str(work / "server.key")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    clients = []
    try:
        wait_ready(admin)
        context = ssl.create_default_context(cafile=str(work / "ca.crt"))
        # Warm: the runtime's first connections allocate what later ones reuse.
        for _ in range(10):
            with context.wrap_socket(socket.create_connection(("127.0.0.1", port)),
                                     server_hostname="127.0.0.1") as c:
                c.sendall(b"PING\r\n")
                c.recv(16)
        time.sleep(1)
        before = footprint(gate.pid)
        for _ in range(CONNECTIONS):
            c = context.wrap_socket(socket.create_connection(("127.0.0.1", port)),
                                    server_hostname="127.0.0.1")
            c.sendall(b"PING\r\n")
            if c.recv(16) != b"+PONG\r\n":
                sys.exit("a TLS client was not answered +PONG")
            clients.append(c)
        # Idle: the connections' buffers go back after half a second.
        time.sleep(2)
        after = footprint(gate.pid)
        return before, after
    finally:
        for c in clients:
            c.close()
        gate.terminate()
        gate.wait()


def main():
    binaries = sys.argv[1:] or [str(ROOT / "target" / "release" / "stockgate")]
    for tool in ("redis-server", "openssl"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is needed: deploy/install-deps.sh dev")
    with tempfile.TemporaryDirectory(prefix="stockgate-tls-idle-") as tmp:
        work = pathlib.Path(tmp)
        certificates(work)
        redis_port = free_port()
        redis = subprocess.Popen(
            ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(redis_port, redis, "redis-server")
            print(f"{CONNECTIONS} idle TLS connections (handshaken, one PING each)")
            print(f"{'binary':<48} {'fds/conn':>9} {'KiB/conn':>9}")
            for binary in binaries:
                (fds0, rss0), (fds1, rss1) = measure(binary, work, redis_port)
                print(f"{binary:<48} {(fds1 - fds0) / CONNECTIONS:>9.2f} "
                      f"{(rss1 - rss0) / CONNECTIONS:>9.1f}")
        finally:
            redis.terminate()
            redis.wait()


if __name__ == "__main__":
    main()
