#!/usr/bin/env python3
"""qweb's traffic control side by side with nginx (issue 39): the same cases against both,
with equivalent configs on free ports, printed as a table. Exits 1 when an answer differs
from the one recorded below (EXPECTED), so a change in either server shows.

    scripts/compare-traffic.py [--qweb target/debug/qweb] [--nginx /usr/sbin/nginx]

Covered: rate limit (10/s burst 5, 30 immediate requests), deny on /admin with path tricks,
basic auth with one bcrypt htpasswd file; forward_auth against auth_request (a threaded
python auth service and a python upstream echoing the headers it gets, both started here);
the PROXY protocol (raw v1/v2 bytes over a socket, from 127.0.0.1, trusted, and 127.0.0.2,
not); client certificates (openssl makes a CA, another CA, a client of each, an expired
one and a serverAuth-only one in the temporary folder; `ssl_verify_client on` and `optional`
against `required = true` and `false`; python's ssl module is the client).
"""

import argparse
import http.server
import json
import os
import re
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
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
    location /app {{
      auth_request /_auth;
      auth_request_set $user $upstream_http_x_user;
      proxy_set_header X-User $user;
      proxy_pass http://127.0.0.1:{up};
    }}
    location /deadauth {{
      auth_request /_deadauth;
      auth_request_set $user $upstream_http_x_user;
      proxy_set_header X-User $user;
      proxy_pass http://127.0.0.1:{up};
    }}
    location = /_auth {{
      internal;
      proxy_pass http://127.0.0.1:{auth}/check;
      proxy_pass_request_body off;
      proxy_set_header Content-Length "";
      proxy_connect_timeout 2s; proxy_read_timeout 2s;
    }}
    location = /_deadauth {{
      internal;
      proxy_pass http://127.0.0.1:{dead}/check;
      proxy_pass_request_body off;
      proxy_set_header Content-Length "";
      proxy_connect_timeout 2s; proxy_read_timeout 2s;
    }}
    location /mtls {{
      proxy_set_header X-Client-Subject $ssl_client_s_dn;
      proxy_set_header X-Client-Fingerprint $ssl_client_fingerprint;
      proxy_pass http://127.0.0.1:{up};
    }}
  }}
  server {{
    listen 127.0.0.1:{pport} proxy_protocol;
    set_real_ip_from 127.0.0.1;
    real_ip_header proxy_protocol;
    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    location / {{ proxy_pass http://127.0.0.1:{up}; }}
    location /only-proxied {{ allow 203.0.113.7; deny all; proxy_pass http://127.0.0.1:{up}; }}
    location /only-local {{ allow 127.0.0.1; deny all; proxy_pass http://127.0.0.1:{up}; }}
  }}
  server {{
    listen 127.0.0.1:{tport} ssl;
    ssl_certificate {d}/pki/site.crt;
    ssl_certificate_key {d}/pki/site.key;
    ssl_verify_client on;
    ssl_client_certificate {d}/pki/ca.pem;
    ssl_protocols TLSv1.2 TLSv1.3;
    location / {{
      proxy_set_header X-Client-Subject $ssl_client_s_dn;
      proxy_set_header X-Client-Fingerprint $ssl_client_fingerprint;
      proxy_pass http://127.0.0.1:{up};
    }}
  }}
  server {{
    listen 127.0.0.1:{sport} ssl proxy_protocol;
    ssl_certificate {d}/pki/site.crt;
    ssl_certificate_key {d}/pki/site.key;
    ssl_protocols TLSv1.2 TLSv1.3;
    set_real_ip_from 127.0.0.1;
    real_ip_header proxy_protocol;
    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    location / {{ proxy_pass http://127.0.0.1:{up}; }}
  }}
  server {{
    listen 127.0.0.1:{oport} ssl;
    ssl_certificate {d}/pki/site.crt;
    ssl_certificate_key {d}/pki/site.key;
    ssl_verify_client optional;
    ssl_client_certificate {d}/pki/ca.pem;
    ssl_protocols TLSv1.2 TLSv1.3;
    location / {{
      proxy_set_header X-Client-Subject $ssl_client_s_dn;
      proxy_set_header X-Client-Fingerprint $ssl_client_fingerprint;
      proxy_pass http://127.0.0.1:{up};
    }}
  }}
}}
"""

QWEB_CONF = """
workers = 1
state_dir = "{d}/state"
[[listener]]
address = "127.0.0.1:{port}"
[[listener]]
address = "127.0.0.1:{pport}"
proxy_protocol = {{ trusted = ["127.0.0.1"] }}
[[listener]]
address = "127.0.0.1:{tport}"
http2 = false
[listener.tls]
certificates = [{{ cert = "{d}/pki/site.crt", key = "{d}/pki/site.key" }}]
client_auth = {{ ca = "{d}/pki/ca.pem", required = true }}
[[listener]]
address = "127.0.0.1:{oport}"
http2 = false
[listener.tls]
certificates = [{{ cert = "{d}/pki/site.crt", key = "{d}/pki/site.key" }}]
client_auth = {{ ca = "{d}/pki/ca.pem", required = false }}
[[listener]]
address = "127.0.0.1:{sport}"
http2 = false
proxy_protocol = {{ trusted = ["127.0.0.1"] }}
[listener.tls]
certificates = [{{ cert = "{d}/pki/site.crt", key = "{d}/pki/site.key" }}]
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
prefix = "/app"
upstreams = ["127.0.0.1:{up}"]
forward_auth = {{ upstream = "127.0.0.1:{auth}", path = "/check", copy_headers = ["X-User"], timeout = "2s" }}
[[route]]
prefix = "/deadauth"
upstreams = ["127.0.0.1:{up}"]
forward_auth = {{ upstream = "127.0.0.1:{dead}", path = "/check", copy_headers = ["X-User"], timeout = "2s" }}
[[route]]
prefix = "/only-proxied"
allow = ["203.0.113.7"]
upstreams = ["127.0.0.1:{up}"]
[[route]]
prefix = "/only-local"
allow = ["127.0.0.1"]
upstreams = ["127.0.0.1:{up}"]
[[route]]
prefix = "/echo"
upstreams = ["127.0.0.1:{up}"]
[[route]]
prefix = "/mtls"
upstreams = ["127.0.0.1:{up}"]
request_headers = {{ set = {{ "X-Client-Subject" = "{{tls_client_subject}}", "X-Client-Fingerprint" = "{{tls_client_fingerprint}}" }} }}
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
    "auth 2xx X-User: alice; client sent X-User: mallory": ("200 X-User=alice", "200 X-User=alice"),
    "auth 2xx without X-User; client sent X-User: mallory": ("200 X-User=absent", "200 X-User=absent"),
    "auth 2xx without X-User; client sent X-User twice and x-user": (
        "200 X-User=absent", "200 X-User=absent"),
    "auth 403 (a body)": ("403 body: its own", "403 body: the service's"),
    "auth 500 (a body)": ("500 body: its own", "500 body: the service's"),
    "auth 401 (WWW-Authenticate, a body)": (
        '401 WWW-Authenticate: Bearer realm="app"; body: its own',
        '401 WWW-Authenticate: Bearer realm="app"; body: the service\'s'),
    "auth 302 Location: /login": ("500 Location: absent", "302 Location: /login"),
    "auth service dead (connection refused)": ("500", "502"),
    "auth service hangs (timeout 2s)": ("500 after 2 s", "502 after 2 s"),
    "proxy v1 from trusted": ("200 XFF=203.0.113.7", "200 XFF=203.0.113.7"),
    "proxy v1 + client X-Forwarded-For: 198.51.100.1": (
        "200 XFF=198.51.100.1, 203.0.113.7", "200 XFF=198.51.100.1, 203.0.113.7"),
    "proxy v1, allow its address": ("200", "200"),
    "proxy v1, allow 127.0.0.1 only": ("403", "403"),
    "proxy v2 from trusted": ("200 XFF=203.0.113.8", "200 XFF=203.0.113.8"),
    "proxy v1 split across two writes": ("closed", "200 XFF=203.0.113.9"),
    "proxy v1 TCP6 from trusted": ("200 XFF=2001:db8::7", "200 XFF=2001:db8::7"),
    "proxy v1 UNKNOWN (a balancer's health check)": ("200 XFF=127.0.0.1", "200 XFF=127.0.0.1"),
    "proxy v2 LOCAL (a balancer's health check)": ("200 XFF=127.0.0.1", "200 XFF=127.0.0.1"),
    "proxy v2 with a TLV (PP2_TYPE_AUTHORITY)": ("200 XFF=203.0.113.8", "200 XFF=203.0.113.8"),
    "proxy v1 then TLS, from trusted": ("200 XFF=203.0.113.7", "200 XFF=203.0.113.7"),
    "proxy: TLS without a header, from trusted": ("error ConnectionResetError",
                                                  "error ConnectionResetError"),
    "proxy v1 then TLS, from untrusted 127.0.0.2": (
        "200 XFF=127.0.0.2 after 0 s", "TLS error WRONG_VERSION_NUMBER after 5 s"),
    "proxy: no header from trusted": ("closed", "reset"),
    "proxy: garbage header from trusted": ("closed", "reset"),
    "proxy v1 from untrusted 127.0.0.2": ("200 XFF=127.0.0.2", "400"),
    "proxy: no header from untrusted 127.0.0.2": ("closed", "200 XFF=127.0.0.2"),
    "mtls: no certificate": ("400 No required SSL certificate was sent (TLSv1.3)",
                             "alert TLSV13_ALERT_CERTIFICATE_REQUIRED (TLSv1.3)"),
    "mtls: no certificate, TLS 1.2": ("400 No required SSL certificate was sent (TLSv1.2)",
                                      "alert TLSV13_ALERT_CERTIFICATE_REQUIRED (handshake not completed)"),
    "mtls: from the CA (client forges X-Client-Subject)": (
        "200 (TLSv1.3) subject=CN=alice,O=ops", "200 (TLSv1.3) subject=CN=alice,O=ops"),
    "mtls: fingerprint as the upstream sees it": ("sha1 hex, 40 chars", "sha256 hex, 64 chars"),
    "mtls: from another CA": ("400 The SSL certificate error", "alert TLSV1_ALERT_UNKNOWN_CA"),
    "mtls: expired (2020), from the CA": ("400 The SSL certificate error",
                                          "alert SSLV3_ALERT_CERTIFICATE_EXPIRED"),
    "mtls: server-only certificate (serverAuth), from the CA": (
        "400 The SSL certificate error", "alert SSLV3_ALERT_UNSUPPORTED_CERTIFICATE"),
    "mtls optional: no certificate": ("200 (TLSv1.3) subject=absent", "200 (TLSv1.3) subject=absent"),
    "mtls optional: from the CA": (
        "200 (TLSv1.3) subject=CN=alice,O=ops", "200 (TLSv1.3) subject=CN=alice,O=ops"),
    "mtls optional: from another CA": ("400 The SSL certificate error", "alert TLSV1_ALERT_UNKNOWN_CA"),
    "mtls: plain listener, client forges X-Client-Subject": (
        "X-Client-Subject absent", "X-Client-Subject absent"),
}

WHY = {
    "rate: refused status": "RFC 6585: 429 Too Many Requests, with Retry-After; nginx's limit_req_status defaults to 503",
    "deny /ADMIN": "qweb: a path that is another route's when read case-insensitively (an IIS upstream behind `/`) is 400 (pipeline/service.rs route_of); nginx's 404 is the static miss, neither serves /admin",
    "deny /admin%2fa.txt": "qweb refuses %2F before routing (400: the router and a decoding upstream would disagree); nginx decodes it to /admin/a.txt and denies",
    "auth 401 (WWW-Authenticate, a body)": "qweb gives the client the service's answer as sent, body included (as Caddy's forward_auth); nginx's auth_request copies only WWW-Authenticate onto its own 401 page",
    "auth 403 (a body)": "both refuse with 403; nginx's auth_request passes the status on with its own page, qweb the service's answer as sent",
    "auth 500 (a body)": "both 500 here, by different rules: nginx turns any status but 2xx/401/403 into its own 500; qweb passes the service's answer on as sent (a 5xx of the service included)",
    "auth 302 Location: /login": "nginx's auth_request passes on only 401 and 403, any other status is an error (500); qweb gives the client any non-2xx answer as sent, so a login redirect reaches it (as Caddy's forward_auth)",
    "auth service dead (connection refused)": "nginx: a failed auth subrequest is 500; qweb: 502 (RFC 9110 15.6.3, no valid answer from a server it had to ask), never a pass",
    "auth service hangs (timeout 2s)": "both give up at 2 s (nginx proxy_read_timeout 2s, qweb timeout = \"2s\"); nginx 500 as above; qweb 502 for any failure of the service (RFC 9110 15.6.5 would also allow 504 here)",
    "proxy v1 split across two writes": "PROXY spec section 2: the receiver \"may be tolerant to partial headers or may simply drop the connection ... Recommendation is to be tolerant\"; nginx takes the header from its first read only (\"broken header\", closed); qweb waits for the rest (within header_read_timeout)",
    "proxy v1 then TLS, from untrusted 127.0.0.2": "nginx reads the header, does not believe it (set_real_ip_from) and serves the client's own address; qweb reads the PROXY line as the first bytes of the TLS connection: not TLS, so it answers the plain-HTTP-on-HTTPS-port 400 in cleartext, which the client's TLS reads as a bad record (WRONG_VERSION_NUMBER); the 400 comes after 5 s: conn/plain_on_tls.rs waits up to 5 s for the end of a request head that a ClientHello never brings",
    "proxy: no header from trusted": "both close without an answer; qweb looks at the header with MSG_PEEK (conn/proxy_protocol.rs) and closes with those bytes unread, so Linux sends RST (even after 1 byte) (RFC 1122 4.2.2.13: a CLOSE with received data pending SHOULD send a RST); nginx had read them: FIN",
    "proxy: garbage header from trusted": "as above: closed without an answer, qweb with the bytes unread (RST)",
    "proxy v1 from untrusted 127.0.0.2": "nginx reads every client's header and set_real_ip_from decides whose address is believed (127.0.0.2 is not: its own address); qweb reads no header from an untrusted peer: the PROXY line is a bad request (CONFIGURATION.md, PROXY protocol)",
    "proxy: no header from untrusted 127.0.0.2": "nginx's `listen ... proxy_protocol` demands the header from every client; qweb only from `trusted` addresses, others are served with their own",
    "mtls: no certificate": "RFC 8446 4.4.2.4: a server that requires a certificate MAY abort the handshake with certificate_required (116): qweb (rustls) does, the TLS 1.3 client sees it on its first read; nginx completes the handshake and answers 400",
    "mtls: no certificate, TLS 1.2": "rustls sends alert 116 on TLS 1.2 too (defined by RFC 8446 6.2; RFC 5246 7.4.6 names handshake_failure (40) for this); the client sees it inside the handshake; nginx 400 as on 1.3",
    "mtls: server-only certificate (serverAuth), from the CA": "qweb (webpki) requires the clientAuth extended key usage where the certificate has one: unsupported_certificate (43, RFC 8446 6.2) in the handshake; nginx answers 400 after it (its error log, at info: \"26:unsuitable certificate purpose\")",
    "mtls optional: from another CA": "nginx `ssl_verify_client optional` vs qweb `required = false`: both let a client without a certificate in and verify one that is sent; a bad one is refused as with `on`/`true` (400 after the handshake, or unknown_ca in it)",
    "mtls: fingerprint as the upstream sees it": "nginx's $ssl_client_fingerprint is SHA-1; qweb's {tls_client_fingerprint} is SHA-256 (as Caddy's); both match openssl x509 -fingerprint",
    "mtls: from another CA": "qweb fails the handshake with unknown_ca (48, RFC 8446 6.2); nginx completes it and answers 400 \"The SSL certificate error\" (info log: \"21:unable to verify the first certificate\"): the client is not told why",
    "mtls: expired (2020), from the CA": "qweb fails the handshake with certificate_expired (45, RFC 8446 6.2); nginx answers 400 after it (info log: \"10:certificate has expired\")",
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


def request_line(target, headers=()):
    req = f"GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
    for n, v in headers:
        req += f"{n}: {v}\r\n"
    return (req + "\r\n").encode()


def parse(data):
    """(status, headers with lower-case names, body) of a whole HTTP/1.x answer; status
    "closed" when the connection ended without a byte."""
    if not data:
        return "closed", {}, b""
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(" ")[1] if " " in lines[0] else "garbage"
    hs = {}
    for line in lines[1:]:
        n, _, v = line.partition(":")
        hs[n.strip().lower()] = v.strip()
    return status, hs, body


def read_all(s):
    data = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        return data or b"", True
    return data, False


def exchange(port, writes, source="127.0.0.1", timeout=10):
    """Writes each of `writes` on one connection from `source` (0.2 s apart), then reads
    the answer to its end: (status, headers, body); status "reset" for a reset without data."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                  source_address=(source, 0)) as s:
        for i, w in enumerate(writes):
            if i:
                time.sleep(0.2)
            s.sendall(w)
        data, reset = read_all(s)
    if reset and not data:
        return "reset", {}, b""
    return parse(data)


def echoed(body):
    """The request headers the echo upstream saw (lower-case names)."""
    try:
        return {k.lower(): v for k, v in json.loads(body).items()}
    except ValueError:
        return {}


class Echo(http.server.BaseHTTPRequestHandler):
    """The upstream: answers 200 with the request's headers as a JSON object."""

    def do_GET(self):
        body = json.dumps({k: v for k, v in self.headers.items()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


AUTH_BODY = b"auth service says no\n"


class Auth(http.server.BaseHTTPRequestHandler):
    """The auth service: what it answers is the client's X-Case (the subrequest carries the
    client's header fields, with nginx's auth_request as with qweb's forward_auth)."""

    def do_GET(self):
        case = self.headers.get("X-Case", "")
        if case == "hang":
            time.sleep(6)
        if case in ("ok", "hang"):
            self.answer(200, [("X-User", "alice")], b"ok\n")
        elif case == "anon":
            self.answer(200, [], b"ok\n")
        elif case == "forbid":
            self.answer(403, [], b"auth service forbids\n")
        elif case == "broken":
            self.answer(500, [], b"auth service broke\n")
        elif case == "login":
            self.answer(302, [("Location", "/login")], b"log in first\n")
        else:
            self.answer(401, [("WWW-Authenticate", 'Bearer realm="app"')], AUTH_BODY)

    def answer(self, status, headers, body):
        try:
            self.send_response(status)
            for n, v in headers:
                self.send_header(n, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass

    def log_message(self, *a):
        pass


def serve(handler):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], check=True, cwd=cwd, capture_output=True)


def make_pki(d):
    """ca.pem (the client CA), site.crt/key (the server's), alice (from the CA), mallory
    (from another CA), old (from the CA, expired in 2020)."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    ca_ext = ["-addext", "basicConstraints=critical,CA:TRUE",
              "-addext", "keyUsage=critical,keyCertSign,cRLSign"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "30",
            "-subj", "/CN=Client CA", *ca_ext, cwd=d)
    openssl("req", "-x509", *ec, "-keyout", "other.key", "-out", "other.pem", "-days", "30",
            "-subj", "/CN=Other CA", *ca_ext, cwd=d)
    openssl("req", "-x509", *ec, "-keyout", "site.key", "-out", "site.crt", "-days", "30",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost", cwd=d)
    with open(f"{d}/client.ext", "w") as f:
        f.write("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    for name, ca in [("alice", "ca"), ("mallory", "other")]:
        openssl("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/O=ops/CN={name}", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                "-CAcreateserial", "-days", "30", "-extfile", "client.ext", "-out", f"{name}.crt",
                cwd=d)
    with open(f"{d}/server.ext", "w") as f:
        f.write("basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    openssl("req", "-new", *ec, "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/O=ops/CN=srv",
            cwd=d)
    openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "30", "-extfile", "server.ext", "-out", "srv.crt", cwd=d)
    with open(f"{d}/ca.cnf", "w") as f:
        f.write(f"[ca]\ndefault_ca = d\n[d]\ndatabase = {d}/index.txt\nnew_certs_dir = {d}\n"
                f"serial = {d}/serial\ndefault_md = sha256\npolicy = p\nx509_extensions = ext\n"
                "[p]\ncommonName = supplied\norganizationName = optional\n"
                "[ext]\nbasicConstraints = CA:FALSE\nextendedKeyUsage = clientAuth\n")
    open(f"{d}/index.txt", "w").close()
    with open(f"{d}/serial", "w") as f:
        f.write("1000\n")
    openssl("req", "-new", *ec, "-keyout", "old.key", "-out", "old.csr", "-subj", "/O=ops/CN=old",
            cwd=d)
    openssl("ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key",
            "-in", "old.csr", "-out", "old.crt", "-notext",
            "-startdate", "20200101000000Z", "-enddate", "20200201000000Z", cwd=d)


def fingerprint(cert, digest):
    out = subprocess.run(["openssl", "x509", "-in", cert, "-noout", "-fingerprint", f"-{digest}"],
                         check=True, capture_output=True, text=True).stdout
    return out.strip().split("=", 1)[1].replace(":", "").lower()


def tls_get(port, pki, client=None, headers=(), tls12=False, before=b"", source="127.0.0.1",
            target="/mtls/x"):
    """One GET over TLS presenting `client`'s certificate (None: none): (what the client
    sees: the status and <title>, or the TLS alert, the TLS version, the echoed headers)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    if client:
        ctx.load_cert_chain(f"{pki}/{client}.crt", f"{pki}/{client}.key")
    version = "handshake not completed"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10,
                                      source_address=(source, 0)) as raw:
            raw.sendall(before)
            with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                version = s.version()
                s.sendall(request_line(target, headers))
                data, _ = read_all(s)
    except ssl.SSLError as e:
        return ("alert " if "ALERT" in (e.reason or "") else "TLS error ") + str(e.reason), version, {}
    except OSError as e:
        return f"error {e.__class__.__name__}", version, {}
    status, _, body = parse(data)
    if status == "200":
        return status, version, echoed(body)
    if status in ("closed", "reset"):
        return status, version, {}
    m = re.search(rb"<title>(.*?)</title>", body)
    return f"{m.group(1).decode()}" if m else status, version, {}


def v1(src):
    return f"PROXY TCP4 {src} 127.0.0.1 40000 80\r\n".encode()


def v2(src, command=0x21, tlvs=b""):
    """A v2 block, TCP over IPv4 from `src` (command 0x21: PROXY, 0x20: LOCAL), `tlvs` after
    the addresses."""
    addrs = socket.inet_aton(src) + socket.inet_aton("127.0.0.1") + struct.pack(">HH", 40000, 80)
    rest = addrs + tlvs
    return b"\r\n\r\n\x00\r\nQUIT\n" + bytes([command, 0x11]) + struct.pack(">H", len(rest)) + rest


def xff(answer):
    status, _, body = answer
    if status != "200":
        return status
    return f"200 XFF={echoed(body).get('x-forwarded-for', 'absent')}"


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


def cases(ports, pki):
    import base64

    port, pport, tport, oport, sport = ports
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

    # forward_auth / auth_request
    forged = ("X-User", "mallory")

    def user(answer):
        status, _, body = answer
        if status != "200":
            return status
        return f"200 X-User={echoed(body).get('x-user', 'absent')}"

    out["auth 2xx X-User: alice; client sent X-User: mallory"] = user(
        exchange(port, [request_line("/app/x", [("X-Case", "ok"), forged])]))
    out["auth 2xx without X-User; client sent X-User: mallory"] = user(
        exchange(port, [request_line("/app/x", [("X-Case", "anon"), forged])]))
    out["auth 2xx without X-User; client sent X-User twice and x-user"] = user(exchange(
        port, [request_line("/app/x", [("X-Case", "anon"), forged, forged, ("x-user", "eve")])]))
    for case, what in [("forbid", "403"), ("broken", "500")]:
        status, _, body = exchange(port, [request_line("/app/x", [("X-Case", case)])])
        out[f"auth {what} (a body)"] = status + " body: " + (
            "the service's" if body.startswith(b"auth service") else "its own")
    status, hs, body = exchange(port, [request_line("/app/x", [("X-Case", "deny"), forged])])
    out["auth 401 (WWW-Authenticate, a body)"] = (
        f"{status} WWW-Authenticate: {hs.get('www-authenticate', 'absent')}; body: "
        + ("the service's" if body == AUTH_BODY else "its own"))
    status, hs, _ = exchange(port, [request_line("/app/x", [("X-Case", "login")])])
    out["auth 302 Location: /login"] = f"{status} Location: {hs.get('location', 'absent')}"
    out["auth service dead (connection refused)"] = exchange(
        port, [request_line("/deadauth/x", [("X-Case", "ok")])])[0]
    t0 = time.monotonic()
    status = exchange(port, [request_line("/app/x", [("X-Case", "hang")])])[0]
    out["auth service hangs (timeout 2s)"] = f"{status} after {time.monotonic() - t0:.0f} s"

    # PROXY protocol, trusted 127.0.0.1
    out["proxy v1 from trusted"] = xff(exchange(pport, [v1("203.0.113.7") + request_line("/echo")]))
    out["proxy v1 + client X-Forwarded-For: 198.51.100.1"] = xff(exchange(
        pport, [v1("203.0.113.7") + request_line("/echo", [("X-Forwarded-For", "198.51.100.1")])]))
    out["proxy v1, allow its address"] = exchange(
        pport, [v1("203.0.113.7") + request_line("/only-proxied")])[0]
    out["proxy v1, allow 127.0.0.1 only"] = exchange(
        pport, [v1("203.0.113.7") + request_line("/only-local")])[0]
    out["proxy v2 from trusted"] = xff(exchange(pport, [v2("203.0.113.8") + request_line("/echo")]))
    h = v1("203.0.113.9")
    out["proxy v1 split across two writes"] = xff(
        exchange(pport, [h[:12], h[12:] + request_line("/echo")]))
    out["proxy v1 TCP6 from trusted"] = xff(exchange(
        pport, [b"PROXY TCP6 2001:db8::7 ::1 40000 80\r\n" + request_line("/echo")]))
    out["proxy v1 UNKNOWN (a balancer's health check)"] = xff(exchange(
        pport, [b"PROXY UNKNOWN\r\n" + request_line("/echo")]))
    out["proxy v2 LOCAL (a balancer's health check)"] = xff(exchange(
        pport, [v2("203.0.113.8", command=0x20) + request_line("/echo")]))
    authority = b"www.example"
    out["proxy v2 with a TLV (PP2_TYPE_AUTHORITY)"] = xff(exchange(
        pport, [v2("203.0.113.8", tlvs=b"\x02" + struct.pack(">H", len(authority)) + authority)
                + request_line("/echo")]))
    seen, version, hs = tls_get(sport, pki, before=v1("203.0.113.7"), target="/echo")
    out["proxy v1 then TLS, from trusted"] = f"{seen} XFF={hs.get('x-forwarded-for', 'absent')}"
    out["proxy: TLS without a header, from trusted"] = tls_get(sport, pki, target="/echo")[0]
    t0 = time.monotonic()
    seen, version, hs = tls_get(sport, pki, before=v1("203.0.113.7"), source="127.0.0.2",
                                target="/echo")
    out["proxy v1 then TLS, from untrusted 127.0.0.2"] = (
        f"{seen} XFF={hs.get('x-forwarded-for', 'absent')}" if seen == "200" else seen
    ) + f" after {time.monotonic() - t0:.0f} s"
    out["proxy: no header from trusted"] = xff(exchange(pport, [request_line("/echo")]))
    out["proxy: garbage header from trusted"] = xff(
        exchange(pport, [b"HELLO 203.0.113.7\r\n" + request_line("/echo")]))
    out["proxy v1 from untrusted 127.0.0.2"] = xff(
        exchange(pport, [v1("203.0.113.7") + request_line("/echo")], source="127.0.0.2"))
    out["proxy: no header from untrusted 127.0.0.2"] = xff(
        exchange(pport, [request_line("/echo")], source="127.0.0.2"))

    # client certificates
    seen, version, _ = tls_get(tport, pki)
    out["mtls: no certificate"] = f"{seen} ({version})"
    seen, version, _ = tls_get(tport, pki, tls12=True)
    out["mtls: no certificate, TLS 1.2"] = f"{seen} ({version})"
    forged = [("X-Client-Subject", "CN=admin"), ("X-Client-Fingerprint", "00")]
    seen, version, hs = tls_get(tport, pki, "alice", forged)
    out["mtls: from the CA (client forges X-Client-Subject)"] = (
        f"{seen} ({version}) subject={hs.get('x-client-subject', 'absent')}")
    fp = hs.get("x-client-fingerprint", "absent")
    digests = {fingerprint(f"{pki}/alice.crt", d): d for d in ("sha1", "sha256")}
    out["mtls: fingerprint as the upstream sees it"] = (
        f"{digests[fp]} hex, {len(fp)} chars" if fp in digests else fp)
    out["mtls: from another CA"] = f"{tls_get(tport, pki, 'mallory')[0]}"
    out["mtls: expired (2020), from the CA"] = f"{tls_get(tport, pki, 'old')[0]}"
    out["mtls: server-only certificate (serverAuth), from the CA"] = tls_get(tport, pki, "srv")[0]
    seen, version, hs = tls_get(oport, pki)
    out["mtls optional: no certificate"] = (
        f"{seen} ({version}) subject={hs.get('x-client-subject', 'absent')}")
    seen, version, hs = tls_get(oport, pki, "alice")
    out["mtls optional: from the CA"] = (
        f"{seen} ({version}) subject={hs.get('x-client-subject', 'absent')}")
    out["mtls optional: from another CA"] = tls_get(oport, pki, "mallory")[0]
    _, _, body = exchange(port, [request_line("/mtls/x", forged)])
    out["mtls: plain listener, client forges X-Client-Subject"] = (
        "X-Client-Subject " + echoed(body).get("x-client-subject", "absent"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qweb", default="target/debug/qweb")
    ap.add_argument("--nginx", default="/usr/sbin/nginx")
    a = ap.parse_args()
    up, auth = serve(Echo), serve(Auth)
    dead = free_port()  # nobody listens there
    with tempfile.TemporaryDirectory() as d:
        for sub in ["site/limited", "site/admin", "site/ops", "state", "pki"]:
            os.makedirs(f"{d}/{sub}")
        for sub in ["limited", "admin", "ops"]:
            with open(f"{d}/site/{sub}/a.txt", "w") as f:
                f.write("a\n")
        users = subprocess.run(["htpasswd", "-nbB", "-C", "5", "alice", "s3cret"],
                               check=True, capture_output=True, text=True).stdout.strip()
        with open(f"{d}/users", "w") as f:
            f.write(users + "\n")
        make_pki(f"{d}/pki")
        nports = tuple(free_port() for _ in range(5))
        qports = tuple(free_port() for _ in range(5))
        common = dict(d=d, up=up.server_port, auth=auth.server_port, dead=dead)
        with open(f"{d}/nginx.conf", "w") as f:
            f.write(NGINX_CONF.format(port=nports[0], pport=nports[1], tport=nports[2], oport=nports[3], sport=nports[4], **common))
        with open(f"{d}/qweb.toml", "w") as f:
            f.write(QWEB_CONF.format(port=qports[0], pport=qports[1], tport=qports[2], oport=qports[3], sport=qports[4], **common))
        procs = [
            subprocess.Popen([a.nginx, "-p", d, "-c", f"{d}/nginx.conf"]),
            subprocess.Popen([a.qweb, "serve", "--config", f"{d}/qweb.toml"],
                             stdout=subprocess.DEVNULL),
        ]
        try:
            for port in nports:
                wait_port(port, procs[0], "nginx")
            for port in qports:
                wait_port(port, procs[1], "qweb")
            got_n, got_q = cases(nports, f"{d}/pki"), cases(qports, f"{d}/pki")
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
    for case in [c for c in got_n if c not in EXPECTED]:
        bad += 1
        print(f"| {case} | {got_n[case]} | {got_q.get(case)} | NO (not recorded) | |")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
