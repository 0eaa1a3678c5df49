#!/usr/bin/env python3
"""qweb's traffic control side by side with nginx (issue 39): the same cases against both,
with equivalent configs on free ports, printed as a table. Exits 1 when an answer differs
from the one recorded below (EXPECTED), so a change in either server shows.

    scripts/compare-traffic.py [--qweb target/debug/qweb] [--nginx /usr/sbin/nginx]

Covered so far: rate limit (10/s burst 5, 30 immediate requests), deny on /admin with path
tricks, basic auth with one bcrypt htpasswd file. Not yet: forward_auth/auth_request, the
PROXY protocol, client certificates.
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time

NGINX_CONF = """
daemon off; master_process off; pid {d}/nginx.pid; error_log {d}/nginx-error.log;
events {{}}
http {{
  access_log off;
  client_body_temp_path {d}/t1; proxy_temp_path {d}/t2; fastcgi_temp_path {d}/t3;
  uwsgi_temp_path {d}/t4; scgi_temp_path {d}/t5;
  limit_req_zone $binary_remote_addr zone=z:1m rate=10r/s;
  server {{
    listen 127.0.0.1:{port};
    root {d}/site;
    location /limited {{ limit_req zone=z burst=5 nodelay; }}
    location /admin {{ deny all; }}
    location /ops {{ auth_basic "ops"; auth_basic_user_file {d}/users; }}
  }}
}}
"""

QWEB_CONF = """
workers = 1
state_dir = "{d}/state"
[[listener]]
address = "127.0.0.1:{port}"
[[route]]
prefix = "/limited"
root = "{d}/site"
rate_limit = {{ rate = "10/s", burst = 5 }}
[[route]]
prefix = "/admin"
root = "{d}/site"
allow = ["192.0.2.1"]
[[route]]
prefix = "/ops"
root = "{d}/site"
basic_auth = {{ realm = "ops", users = "{d}/users" }}
[[route]]
prefix = "/"
root = "{d}/site"
"""

TRICKS = ["/admin/a.txt", "/admin;x", "/ADMIN", "//admin/a.txt", "/%61dmin/a.txt", "/admin%2fa.txt"]

# case -> (nginx, qweb), with the reason where they differ
EXPECTED = {
    "rate: passed of 30": ("6", "6"),
    "rate: refused status": ("503", "429 Retry-After"),
    "deny /admin/a.txt": ("403", "403"),
    "deny /admin;x": ("403", "403"),
    "deny /ADMIN": ("404", "400"),
    "deny //admin/a.txt": ("403", "403"),
    "deny /%61dmin/a.txt": ("403", "403"),
    "deny /admin%2fa.txt": ("403", "400"),
    "basic: none": ("401", "401"),
    "basic: wrong": ("401", "401"),
    "basic: right": ("200", "200"),
}

WHY = {
    "rate: refused status": "RFC 6585: 429 Too Many Requests, with Retry-After; nginx's limit_req_status defaults to 503",
    "deny /ADMIN": "qweb: a path that is another route's when read case-insensitively (an IIS upstream behind `/`) is 400 (pipeline/service.rs route_of); nginx's 404 is the static miss, neither serves /admin",
    "deny /admin%2fa.txt": "qweb refuses %2F before routing (400: the router and a decoding upstream would disagree); nginx decodes it to /admin/a.txt and denies",
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, target, headers=()):
    """Status (and Retry-After's presence) of one GET on its own connection."""
    req = f"GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
    for n, v in headers:
        req += f"{n}: {v}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall((req + "\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head = data.split(b"\r\n\r\n")[0].decode("latin-1")
    status = head.split(" ")[1] if " " in head else "closed"
    retry = any(line.lower().startswith("retry-after:") for line in head.split("\r\n"))
    return status, retry


def wait_port(port, proc, what):
    for _ in range(200):
        if proc.poll() is not None:
            sys.exit(f"{what} exited: {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} does not listen on {port}")


def cases(port):
    import base64

    out = {}
    statuses = [get(port, "/limited/a.txt") for _ in range(30)]
    out["rate: passed of 30"] = str(sum(1 for s, _ in statuses if s == "200"))
    refused = {s + (" Retry-After" if r else "") for s, r in statuses if s != "200"}
    out["rate: refused status"] = ",".join(sorted(refused))
    for t in TRICKS:
        out[f"deny {t}"] = get(port, t)[0]
    auth = lambda p: [("Authorization", "Basic " + base64.b64encode(f"alice:{p}".encode()).decode())]
    out["basic: none"] = get(port, "/ops/a.txt")[0]
    out["basic: wrong"] = get(port, "/ops/a.txt", auth("guess"))[0]
    out["basic: right"] = get(port, "/ops/a.txt", auth("s3cret"))[0]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qweb", default="target/debug/qweb")
    ap.add_argument("--nginx", default="/usr/sbin/nginx")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        for sub in ["site/limited", "site/admin", "site/ops", "state"]:
            os.makedirs(f"{d}/{sub}")
        for sub in ["limited", "admin", "ops"]:
            with open(f"{d}/site/{sub}/a.txt", "w") as f:
                f.write("a\n")
        users = subprocess.run(["htpasswd", "-nbB", "-C", "5", "alice", "s3cret"],
                               check=True, capture_output=True, text=True).stdout.strip()
        with open(f"{d}/users", "w") as f:
            f.write(users + "\n")
        np, qp = free_port(), free_port()
        with open(f"{d}/nginx.conf", "w") as f:
            f.write(NGINX_CONF.format(d=d, port=np))
        with open(f"{d}/qweb.toml", "w") as f:
            f.write(QWEB_CONF.format(d=d, port=qp))
        procs = [
            subprocess.Popen([a.nginx, "-p", d, "-c", f"{d}/nginx.conf"]),
            subprocess.Popen([a.qweb, "serve", "--config", f"{d}/qweb.toml"],
                             stdout=subprocess.DEVNULL),
        ]
        try:
            wait_port(np, procs[0], "nginx")
            wait_port(qp, procs[1], "qweb")
            got_n, got_q = cases(np), cases(qp)
        finally:
            for p in procs:
                p.terminate()
                p.wait()
    bad = 0
    print(f"| case | nginx | qweb | as recorded | why they differ |")
    print(f"|---|---|---|---|---|")
    for case, want in EXPECTED.items():
        got = (got_n.get(case), got_q.get(case))
        ok = got == want
        bad += not ok
        print(f"| {case} | {got[0]} | {got[1]} | {'yes' if ok else f'NO (recorded {want})'} | {WHY.get(case, '')} |")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
