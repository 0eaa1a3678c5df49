#!/usr/bin/env python3
"""Responses served from a cache: qweb (`cache = {}`) against nginx `proxy_cache` and Varnish,
in server CPU per request (issue 38's goal, the pinned method of issue 37).

Each server runs one worker pinned to CPU 0 (`taskset -c 0`); the load generator is pinned to
CPU 1; the figure is the server's own CPU time (user + system of its whole process tree, from
/proc) divided by the requests the client completed. The origin (a python server, on CPU 1 too)
answers `Cache-Control: public, max-age=3600`; a warm-up fills each cache, and every measured
request is a hit (checked: the origin's request count does not move during the rounds).
Rounds are interleaved (the servers' order alternates), medians are reported.

Rows: 1 KiB and 100 KiB over plain HTTP/1.1 (wrk, keep-alive), and 1 KiB and 100 KiB over HTTP/2
(h2load, 8 connections x 16 and x 10 streams), over TLS for all three. Varnish has no TLS: hitch
(Varnish Software's TLS proxy, one worker, also on CPU 0) terminates it and hands the
connection to Varnish with a PROXY v2 header, as Varnish's documentation sets it up; the CPU of
both counts as Varnish's.

Needs: wrk, h2load (nghttp2-client), nginx, varnishd, hitch, taskset, openssl, a release build of qweb
(`cargo build --release --bin qweb`; or QWEB=path). Not run by CI (a benchmark).

    python3 scripts/bench-cache.py [--rounds 3] [--secs 8]
"""

import argparse
import http.server
import os
import re
import shutil
import signal
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ORIGIN = 21001
PORTS = {
    "qweb": (21080, 21443),
    "nginx": (21180, 21543),
    "varnish": (21280, 21643),
}
# Varnish has no TLS: hitch (Varnish Software's TLS proxy) terminates it, as Varnish's docs
# advise, and passes the connection on with a PROXY v2 header to this Varnish listener.
VARNISH_FROM_HITCH = 21281
SIZES = {"1k": 1024, "100k": 100 * 1024}
# processes that serve beside a server and whose CPU counts as its own (Varnish's hitch)
HELPERS = {}
CLK = os.sysconf("SC_CLK_TCK")


class Origin(http.server.BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self):
        Origin.hits += 1
        name = self.path.strip("/")
        size = SIZES.get(name)
        if size is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Cache-Control", "public, max-age=3600")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        self.wfile.write(b"x" * size)

    def log_message(self, *a):
        pass


def tree_cpu(pid):
    """User + system seconds of `pid` and every descendant."""
    children = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            stat = open(f"/proc/{p}/stat").read()
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2 :].split()
        children.setdefault(int(rest[1]), []).append((int(p), rest))
    total, todo = 0.0, [pid]
    try:
        stat = open(f"/proc/{pid}/stat").read()
        rest = stat[stat.rindex(")") + 2 :].split()
        total += (int(rest[11]) + int(rest[12])) / CLK
    except OSError:
        return 0.0
    while todo:
        for c, rest in children.get(todo.pop(), []):
            total += (int(rest[11]) + int(rest[12])) / CLK
            todo.append(c)
    return total


def wait_port(port, secs=20):
    import socket

    end = time.time() + secs
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on {port}")


def start(name, work, qweb):
    plain, tls = PORTS[name]
    cert, key = f"{work}/cert.pem", f"{work}/key.pem"
    pin = ["taskset", "-c", "0"]
    if name == "qweb":
        conf = f"""workers = 1
state_dir = "{work}/qweb-state"
[log]
access = false
[[listener]]
address = "127.0.0.1:{plain}"
[[listener]]
address = "127.0.0.1:{tls}"
[listener.tls]
certificates = [{{ cert = "{cert}", key = "{key}" }}]
resumption = false
[[route]]
prefix = "/"
upstreams = ["127.0.0.1:{ORIGIN}"]
cache = {{}}
"""
        open(f"{work}/qweb.toml", "w").write(conf)
        cmd = pin + [qweb, "serve", "--config", f"{work}/qweb.toml"]
    elif name == "nginx":
        os.makedirs(f"{work}/nginx/cache", exist_ok=True)
        conf = f"""worker_processes 1;
user root;
daemon off;
master_process on;
pid {work}/nginx/nginx.pid;
error_log {work}/nginx/error.log;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 10000000;
    proxy_cache_path {work}/nginx/cache levels=1:2 keys_zone=c:10m max_size=256m;
    upstream origin {{ server 127.0.0.1:{ORIGIN}; keepalive 16; }}
    server {{
        listen 127.0.0.1:{plain};
        listen 127.0.0.1:{tls} ssl http2;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_session_cache off;
        ssl_session_tickets off;
        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache c;
        }}
    }}
}}
"""
        open(f"{work}/nginx/nginx.conf", "w").write(conf)
        cmd = pin + ["nginx", "-c", f"{work}/nginx/nginx.conf", "-p", f"{work}/nginx"]
    else:
        cmd = pin + [
            "varnishd", "-F", "-a", f"127.0.0.1:{plain}",
            "-a", f"127.0.0.1:{VARNISH_FROM_HITCH},PROXY", "-b", f"127.0.0.1:{ORIGIN}",
            "-s", "malloc,256m", "-n", f"{work}/varnish", "-p", "feature=+http2",
            "-p", "thread_pools=1",
        ]
    log = open(f"{work}/{name}.log", "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_port(plain)
    if name == "varnish":
        with open(f"{work}/hitch.pem", "w") as pem:
            pem.write(open(key).read() + open(cert).read())
        hitch = subprocess.Popen(
            pin + ["hitch", f"--frontend=[127.0.0.1]:{tls}", f"--backend=[127.0.0.1]:{VARNISH_FROM_HITCH}",
                   "--workers=1", "--write-proxy-v2", "--alpn-protos=h2,http/1.1",
                   "--tls-protos=TLSv1.3", "--user=root", f"{work}/hitch.pem"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        HELPERS[name] = hitch
    if tls:
        wait_port(tls)
    return p


def load(kind, url, secs):
    """Runs the client pinned to CPU 1; the requests it completed (all checked 2xx)."""
    pin = ["taskset", "-c", "1"]
    if kind == "wrk":
        out = subprocess.run(
            pin + ["wrk", "-t1", "-c32" if "1k" in url else "-c8", f"-d{secs}s", url],
            capture_output=True, text=True, check=True,
        ).stdout
        n = int(re.search(r"(\d+) requests in", out).group(1))
        if "Non-2xx" in out or "Socket errors" in out:
            raise SystemExit(f"wrk saw errors on {url}:\n{out}")
        return n
    # 8 connections x 16 streams for 1 KiB, x 10 for 100 KiB (issue 37's rows)
    n, m = (200000, "-m16") if "1k" in url else (20000, "-m10")
    out = subprocess.run(
        pin + ["h2load", "-n", str(n), "-c8", m, "-t1", url],
        capture_output=True, text=True, check=True,
    ).stdout
    m = re.search(r"(\d+) succeeded, (\d+) failed, (\d+) errored", out)
    ok = int(m.group(1))
    if ok != n:
        raise SystemExit(f"h2load: {ok} of {n} succeeded on {url}:\n{out}")
    codes = re.search(r"status codes: (\d+) 2xx", out)
    if int(codes.group(1)) != n:
        raise SystemExit(f"h2load: not every answer 2xx on {url}:\n{out}")
    return n


def rows():
    return [
        ("1 KiB, HTTP/1.1 keep-alive (wrk -t1 -c32)", "wrk", "1k", "http"),
        ("100 KiB, HTTP/1.1 keep-alive (wrk -t1 -c8)", "wrk", "100k", "http"),
        ("1 KiB, HTTP/2, 8 conns x 16 streams (h2load)", "h2", "1k", "https"),
        ("100 KiB, HTTP/2, 8 conns x 10 streams (h2load)", "h2", "100k", "https"),
    ]


def url_of(name, scheme, file):
    plain, tls = PORTS[name]
    if scheme == "https" and tls:
        return f"https://127.0.0.1:{tls}/{file}"
    return f"http://127.0.0.1:{plain}/{file}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--secs", type=int, default=8)
    args = ap.parse_args()
    qweb = os.environ.get("QWEB", "target/release/qweb")
    for tool in ["wrk", "h2load", "nginx", "varnishd", "hitch", "taskset", "openssl"]:
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is needed")
    work = tempfile.mkdtemp(prefix="bench-cache-")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", f"{work}/key.pem", "-out", f"{work}/cert.pem"],
        check=True, capture_output=True,
    )
    socketserver.TCPServer.allow_reuse_address = True
    origin = http.server.ThreadingHTTPServer(("127.0.0.1", ORIGIN), Origin)
    threading.Thread(target=origin.serve_forever, daemon=True).start()
    procs = {}
    try:
        for name in PORTS:
            procs[name] = start(name, work, qweb)
        # fill every cache, and warm up
        for name in PORTS:
            for file in SIZES:
                for scheme in ["http", "https"]:
                    u = url_of(name, scheme, file)
                    ctx = __import__("ssl")._create_unverified_context()
                    for _ in range(3):
                        urllib.request.urlopen(u, context=ctx).read()
        filled = Origin.hits
        results = {}
        for rnd in range(args.rounds):
            order = list(PORTS) if rnd % 2 == 0 else list(reversed(PORTS))
            for title, kind, file, scheme in rows():
                for name in order:
                    u = url_of(name, scheme, file)
                    pids = [procs[name].pid] + [h.pid for k, h in HELPERS.items() if k == name]
                    c0 = sum(tree_cpu(x) for x in pids)
                    n = load(kind, u, args.secs)
                    c1 = sum(tree_cpu(x) for x in pids)
                    us = (c1 - c0) / n * 1e6
                    results.setdefault((title, name), []).append(us)
                    print(f"round {rnd + 1} {name:8} {title}: {n} requests, {us:.2f} us/request",
                          file=sys.stderr)
        if Origin.hits != filled:
            raise SystemExit(
                f"the origin saw {Origin.hits - filled} requests during the rounds: not every "
                "request was a hit")
        print(f"\nServer CPU per request from cache (us, median of {args.rounds} rounds; lower "
              "is better)\n")
        print("| row | qweb | nginx proxy_cache | Varnish | qweb / nginx | qweb / Varnish |")
        print("|---|---:|---:|---:|---:|---:|")
        for title, kind, file, scheme in rows():
            med = {n: statistics.median(results[(title, n)]) for n in PORTS}
            note = " (Varnish: behind hitch, both counted)" if scheme == "https" else ""
            print(f"| {title}{note} | {med['qweb']:.2f} | {med['nginx']:.2f} | "
                  f"{med['varnish']:.2f} | {med['qweb'] / med['nginx']:.2f} | "
                  f"{med['qweb'] / med['varnish']:.2f} |")
        print("\nEvery run:", file=sys.stderr)
        for k, v in results.items():
            print(f"  {k[1]:8} {k[0]}: " + ", ".join(f"{x:.2f}" for x in v), file=sys.stderr)
    finally:
        for p in list(procs.values()) + list(HELPERS.values()):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except OSError:
                pass
        for p in list(procs.values()) + list(HELPERS.values()):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        origin.shutdown()


if __name__ == "__main__":
    main()
