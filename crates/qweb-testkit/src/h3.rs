//! HTTP/3 clients others wrote: python's `aioquic` (`pip install aioquic`), driven by a small
//! script, and a flood of garbage QUIC Initial packets.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};

/// One request of [`aioquic`].
#[derive(Debug, Clone)]
pub struct H3Request {
    /// `GET`, `HEAD`...
    pub method: &'static str,
    /// The `:path`.
    pub path: String,
    /// Extra header fields.
    pub headers: Vec<(String, String)>,
    /// A request body (sent in one DATA frame, then the stream's end).
    pub body: Option<Vec<u8>>,
}

impl H3Request {
    /// A GET of `path`.
    pub fn get(path: &str) -> Self {
        H3Request {
            method: "GET",
            path: path.into(),
            headers: Vec::new(),
            body: None,
        }
    }

    /// A HEAD of `path`.
    pub fn head(path: &str) -> Self {
        H3Request {
            method: "HEAD",
            ..H3Request::get(path)
        }
    }

    /// A POST of `body` to `path`.
    pub fn post(path: &str, body: &[u8]) -> Self {
        H3Request {
            method: "POST",
            body: Some(body.to_vec()),
            ..H3Request::get(path)
        }
    }

    /// With header field `name: value`. A pseudo-header (`:authority`, `:scheme`) replaces
    /// the client's own value of it.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// With `:authority` `host` instead of `localhost:PORT` (the TLS SNI stays `localhost`).
    pub fn authority(self, host: &str) -> Self {
        self.header(":authority", host)
    }
}

/// What `aioquic` received for one request.
#[derive(Debug, Clone)]
pub struct H3Response {
    /// `:status`.
    pub status: u16,
    /// Header names in lower case, in order.
    pub headers: Vec<(String, String)>,
    /// The body's bytes.
    pub body: Vec<u8>,
    /// Trailer fields (a HEADERS frame after the response's head), names in lower case.
    pub trailers: Vec<(String, String)>,
}

impl H3Response {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        first(&self.headers, name)
    }

    /// Every value of header `name` (lower case), in order.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The first value of trailer field `name` (lower case).
    pub fn trailer(&self, name: &str) -> Option<&str> {
        first(&self.trailers, name)
    }
}

fn first<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// Is `aioquic` importable? `false` after a `SKIPPED` line; a panic instead where `CI` is set
/// ([`crate::tools::require`]; `.ci/run` installs it).
pub fn aioquic_available() -> bool {
    crate::tools::require("aioquic")
}

/// The client: one QUIC connection, every request on its own stream at once, ALPN h3, the
/// test CA trusted, SNI `localhost`. `greedy`: after the handshake, ignore the server's
/// stream limit (a hostile client opening more streams than allowed). A HEADERS frame after
/// a final response's head is its trailers. Prints one JSON line: `{"ok": [...responses...]}`
/// or `{"error": "..."}`.
const CLIENT: &str = r#"
import asyncio, json, os, sys
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated

host, port, ca, greedy = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
reqs = json.loads(sys.stdin.read())

class H3(H3Connection):
    # aioquic checks a response's Content-Length against its body even for HEAD, whose
    # response has the length of the GET and no body (RFC 9110 9.3.2), and for a 304, which
    # may carry the length of the 200 (RFC 9110 8.6, RFC 9114 4.1.2): not checked for those.
    heads = set()
    def _decode_headers(self, stream_id, frame_data):
        headers = super()._decode_headers(stream_id, frame_data)
        if (b":status", b"304") in headers:
            self.heads.add(stream_id)
        return headers
    def _check_content_length(self, stream):
        if stream.stream_id not in self.heads:
            super()._check_content_length(stream)

class Client(QuicConnectionProtocol):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.h3 = H3(self._quic)
        self.waiters = {}
        self.resp = {}
        self.closed = asyncio.get_event_loop().create_future()

    def quic_event_received(self, event):
        if isinstance(event, ConnectionTerminated):
            if not self.closed.done():
                self.closed.set_result(event.error_code)
            for w in self.waiters.values():
                if not w.done():
                    w.set_exception(Exception(f"connection closed: {event.error_code} {event.reason_phrase}"))
        for e in self.h3.handle_event(event):
            r = self.resp.setdefault(e.stream_id, {"status": 0, "headers": [], "trailers": [], "body": b""})
            if isinstance(e, HeadersReceived):
                # after a final head (not a 1xx), a HEADERS frame is the trailers
                into = "trailers" if r["status"] >= 200 else "headers"
                for n, v in e.headers:
                    n, v = n.decode(), v.decode()
                    if n == ":status":
                        r["status"] = int(v)
                        r["headers"] = []
                    else:
                        r[into].append([n, v])
            elif isinstance(e, DataReceived):
                r["body"] += e.data
            if getattr(e, "stream_ended", False) and e.stream_id in self.waiters:
                if not self.waiters[e.stream_id].done():
                    self.waiters[e.stream_id].set_result(r)

    async def request(self, method, path, headers, body):
        sid = self._quic.get_next_available_stream_id()
        if method == "HEAD":
            self.h3.heads.add(sid)
        # a pseudo-header among `headers` replaces the client's own
        pseudo = {":method": method, ":scheme": "https", ":authority": f"localhost:{port}",
                  ":path": path}
        pseudo.update({n: v for n, v in headers if n.startswith(":")})
        rest = [(n, v) for n, v in headers if not n.startswith(":")]
        self.h3.send_headers(sid, [(n.encode(), v.encode()) for n, v in pseudo.items()]
            + [(b"user-agent", b"aioquic")] + [(n.encode(), v.encode()) for n, v in rest],
            end_stream=body is None)
        if body is not None:
            self.h3.send_data(sid, bytes.fromhex(body), end_stream=True)
        w = asyncio.get_event_loop().create_future()
        self.waiters[sid] = w
        self.transmit()
        return await asyncio.wait_for(w, 10)

async def main():
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost")
    cfg.load_verify_locations(ca)
    if os.environ.get("QWEB_H3_CERT"):
        cfg.load_cert_chain(os.environ["QWEB_H3_CERT"], os.environ["QWEB_H3_KEY"])
    async with connect(host, port, configuration=cfg, create_protocol=Client, wait_connected=True) as c:
        if greedy:
            c._quic._remote_max_streams_bidi = 10_000
        out = await asyncio.gather(*(c.request(r[0], r[1], r[2], r[3]) for r in reqs), return_exceptions=True)
        res = []
        for o in out:
            if isinstance(o, BaseException):
                res.append({"error": str(o) or type(o).__name__})
            else:
                res.append({"status": o["status"], "headers": o["headers"],
                            "trailers": o["trailers"], "body": o["body"].hex()})
        # the answers are out before the close, which may wait on a server that is gone
        print(json.dumps({"ok": res}), flush=True)
        c.close()
        try:
            await asyncio.wait_for(c.wait_closed(), 2)
        except BaseException:
            pass
        os._exit(0)

try:
    asyncio.run(asyncio.wait_for(main(), 30))
except BaseException as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
"#;

/// Runs `aioquic` against `addr` (UDP) trusting `ca`: one connection, `reqs` in parallel.
/// `Err`: the connection failed; per request `Err` when that stream failed.
pub fn aioquic(addr: SocketAddr, ca: &Path, reqs: &[H3Request], greedy: bool) -> AioquicResult {
    aioquic_as(addr, ca, None, reqs, greedy)
}

/// [`aioquic`] presenting the client certificate `identity` (certificate and key PEM files)
/// when the server asks for one.
pub fn aioquic_as(
    addr: SocketAddr,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    reqs: &[H3Request],
    greedy: bool,
) -> AioquicResult {
    let list: Vec<serde_json::Value> = reqs
        .iter()
        .map(|r| {
            let body = r.body.as_deref().map(hex);
            serde_json::json!([r.method, r.path, r.headers, body])
        })
        .collect();
    // the requests (bodies included) on stdin: an argument is limited in size
    let mut cmd = Command::new("python3");
    if let Some((cert, key)) = identity {
        cmd.env("QWEB_H3_CERT", cert).env("QWEB_H3_KEY", key);
    }
    let mut child = cmd
        .args(["-c", CLIENT])
        .arg(addr.ip().to_string())
        .arg(addr.port().to_string())
        .arg(ca)
        .arg(if greedy { "1" } else { "0" })
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(serde_json::Value::Array(list).to_string().as_bytes())
            .expect("requests written");
    }
    let out = child.wait_with_output().expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(first.trim()).map_err(|e| {
        format!(
            "aioquic printed no JSON ({e}): {text} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    if let Some(e) = v.get("error") {
        return Err(e.to_string());
    }
    let list = v["ok"].as_array().cloned().unwrap_or_default();
    Ok(list.into_iter().map(parse).collect())
}

/// aioquic's answer: the connection's result, then each request's.
pub type AioquicResult = Result<Vec<Result<H3Response, String>>, String>;

/// One GET of `path` with [`aioquic`] on tokio's blocking pool, so that an async test goes on
/// (polls metrics, shuts the server down) while python waits; the handle gives its result.
pub fn aioquic_get(
    addr: SocketAddr,
    ca: &Path,
    path: &str,
) -> tokio::task::JoinHandle<AioquicResult> {
    let (ca, req) = (ca.to_path_buf(), H3Request::get(path));
    tokio::task::spawn_blocking(move || aioquic(addr, &ca, &[req], false))
}

fn parse(v: serde_json::Value) -> Result<H3Response, String> {
    if let Some(e) = v.get("error") {
        return Err(e.to_string());
    }
    Ok(H3Response {
        status: v["status"].as_u64().unwrap_or(0) as u16,
        headers: fields(&v["headers"]),
        body: unhex(v["body"].as_str().unwrap_or("")),
        trailers: fields(&v["trailers"]),
    })
}

/// `[[name, value], ...]` as pairs.
fn fields(v: &serde_json::Value) -> Vec<(String, String)> {
    v.as_array()
        .map(|hs| {
            hs.iter()
                .map(|h| {
                    (
                        h[0].as_str().unwrap_or("").to_owned(),
                        h[1].as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Lower-case hex (the script's bodies travel as hex).
fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex, decoded (invalid digits read as 0).
fn unhex(s: &str) -> Vec<u8> {
    s.as_bytes()
        .chunks(2)
        .map(|p| {
            std::str::from_utf8(p)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .unwrap_or(0)
        })
        .collect()
}

/// Sends `count` datagrams of garbage shaped like QUIC Initial packets (long header, version
/// 1, random connection IDs and payload) to `addr`, from a new source port every 50 packets.
pub fn initial_flood(addr: SocketAddr, count: usize) {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut socket = None;
    for i in 0..count {
        if i % 50 == 0 {
            socket = Some(std::net::UdpSocket::bind("127.0.0.1:0").expect("bind udp"));
        }
        let mut pkt = vec![0u8; 1200];
        for b in pkt.iter_mut() {
            *b = next() as u8;
        }
        pkt[0] = 0xc0 | (pkt[0] & 0x0f); // long header, Initial
        pkt[1..5].copy_from_slice(&1u32.to_be_bytes()); // QUIC v1
        pkt[5] = 8; // DCID length
        if let Some(s) = &socket {
            let _ = s.send_to(&pkt, addr);
        }
    }
}

/// A client that connects (ALPN h3, the test CA trusted), sends no request and only QUIC
/// PINGs, every `every` ms for up to `within` ms. Prints the milliseconds until the server
/// ended the connection, or `alive`.
const PINGER: &str = r#"
import asyncio, sys, time
from aioquic.asyncio.client import connect
from aioquic.h3.connection import H3_ALPN
from aioquic.quic.configuration import QuicConfiguration

host, port, ca, every, within = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])

async def main():
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost")
    cfg.load_verify_locations(ca)
    async with connect(host, port, configuration=cfg, wait_connected=True) as c:
        start = time.monotonic()
        closed = asyncio.ensure_future(c.wait_closed())
        while (time.monotonic() - start) * 1000 < within:
            try:
                await asyncio.wait_for(c.ping(), every / 1000)
            except asyncio.TimeoutError:
                pass
            except Exception:
                break
            if closed.done():
                break
            await asyncio.sleep(every / 1000)
        if closed.done() or c._quic._close_event is not None:
            print(int((time.monotonic() - start) * 1000), flush=True)
        else:
            print("alive", flush=True)

asyncio.run(main())
"#;

/// Runs the pinger script against `addr`: `Some(elapsed)` when the server ended the connection within
/// `within` (PINGs every `every`), `None` when it was still open.
pub fn aioquic_pinger(
    addr: SocketAddr,
    ca: &Path,
    every: std::time::Duration,
    within: std::time::Duration,
) -> Option<std::time::Duration> {
    let out = Command::new("python3")
        .args(["-c", PINGER])
        .arg(addr.ip().to_string())
        .arg(addr.port().to_string())
        .arg(ca)
        .arg(every.as_millis().to_string())
        .arg(within.as_millis().to_string())
        .output()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    match text.trim() {
        "alive" => None,
        ms => Some(std::time::Duration::from_millis(ms.parse().unwrap_or_else(
            |_| {
                panic!(
                    "the pinger printed {ms:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            },
        ))),
    }
}

/// A streaming exchange on one request stream: the head (not ended), then each message as a
/// DATA frame, the next one sent only once the response body has grown by the message's
/// length (an echo, as a bidirectional gRPC call's replies), then the end of the request.
/// Prints the response as [`CLIENT`] does, or `{"error": ...}` naming the message whose echo
/// did not come within 5 s.
const PINGPONG: &str = r#"
import asyncio, json, os, sys, time
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated

host, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
spec = json.loads(sys.stdin.read())

class Client(QuicConnectionProtocol):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.h3 = H3Connection(self._quic)
        self.r = {"status": 0, "headers": [], "trailers": [], "body": b""}
        self.ended = None
        self.changed = asyncio.Event()

    def quic_event_received(self, event):
        if isinstance(event, ConnectionTerminated):
            self.ended = self.ended or f"connection closed: {event.error_code} {event.reason_phrase}"
        for e in self.h3.handle_event(event):
            r = self.r
            if isinstance(e, HeadersReceived):
                into = "trailers" if r["status"] >= 200 else "headers"
                for n, v in e.headers:
                    n, v = n.decode(), v.decode()
                    if n == ":status":
                        r["status"] = int(v)
                        r["headers"] = []
                    else:
                        r[into].append([n, v])
            elif isinstance(e, DataReceived):
                r["body"] += e.data
            if getattr(e, "stream_ended", False):
                self.ended = self.ended or "ok"
        self.changed.set()

    async def until(self, cond, limit):
        deadline = time.monotonic() + limit
        while not cond() and self.ended is None:
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except asyncio.TimeoutError:
                return cond()
        return cond()

async def main():
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost")
    cfg.load_verify_locations(ca)
    async with connect(host, port, configuration=cfg, create_protocol=Client, wait_connected=True) as c:
        sid = c._quic.get_next_available_stream_id()
        c.h3.send_headers(sid, [(b":method", spec["method"].encode()), (b":scheme", b"https"),
            (b":authority", f"localhost:{port}".encode()), (b":path", spec["path"].encode()),
            (b"user-agent", b"aioquic")] + [(n.encode(), v.encode()) for n, v in spec["headers"]])
        c.transmit()
        for i, m in enumerate(spec["messages"]):
            data = bytes.fromhex(m)
            want = len(c.r["body"]) + len(data)
            c.h3.send_data(sid, data, end_stream=False)
            c.transmit()
            if not await c.until(lambda: len(c.r["body"]) >= want, 5):
                print(json.dumps({"error": f"message {i}: no echo within 5 s ({c.ended}, {len(c.r['body'])} of {want} bytes)"}), flush=True)
                os._exit(0)
        c.h3.send_data(sid, b"", end_stream=True)
        c.transmit()
        await c.until(lambda: c.ended is not None, 10)
        if c.ended != "ok":
            print(json.dumps({"error": f"the response did not end: {c.ended}"}), flush=True)
            os._exit(0)
        r = c.r
        print(json.dumps({"ok": [{"status": r["status"], "headers": r["headers"],
            "trailers": r["trailers"], "body": r["body"].hex()}]}), flush=True)
        c.close()
        os._exit(0)

try:
    asyncio.run(asyncio.wait_for(main(), 60))
except BaseException as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
"#;

/// Runs the ping-pong script against `addr`: `req`'s head (its `body` ignored), then each of
/// `messages` once the previous one came back (a bidirectional stream, as gRPC's), then the
/// request's end. `Err` names the message whose echo did not come.
pub fn aioquic_pingpong(
    addr: SocketAddr,
    ca: &Path,
    req: &H3Request,
    messages: &[&[u8]],
) -> Result<H3Response, String> {
    let spec = serde_json::json!({
        "method": req.method,
        "path": req.path,
        "headers": req.headers,
        "messages": messages.iter().map(|m| hex(m)).collect::<Vec<_>>(),
    });
    let mut child = Command::new("python3")
        .args(["-c", PINGPONG])
        .arg(addr.ip().to_string())
        .arg(addr.port().to_string())
        .arg(ca)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(spec.to_string().as_bytes())
            .expect("request written");
    }
    let out = child.wait_with_output().expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(first.trim()).map_err(|e| {
        format!(
            "aioquic printed no JSON ({e}): {text} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    if let Some(e) = v.get("error") {
        return Err(e.to_string());
    }
    let first = v["ok"].as_array().and_then(|l| l.first()).cloned();
    parse(first.unwrap_or_default())
}
