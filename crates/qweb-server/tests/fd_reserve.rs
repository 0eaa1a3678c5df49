//! A qweb out of file descriptors still answers (its accept loops keep a reserve fd): the
//! process's `RLIMIT_NOFILE` is lowered and its fds taken by idle connections; a new plain
//! connection then gets a 503, a new TLS connection a prompt close, `/metrics` on the admin
//! listener is served, the process does not spin, and once fds are free it serves as usual.
//! One test in its own binary: it lowers the limit of the whole process.
#![allow(unsafe_code)] // setrlimit and sysconf on the test process; each block has its SAFETY note

use qweb_testkit as common;

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Connects `sock` (made before the process ran out of fds: connecting needs none) to
/// `addr`, sends `request`, and reads until the server ends the connection or `within`
/// passed: (what came, whether the server ended it).
async fn exchange(
    sock: TcpSocket,
    addr: std::net::SocketAddr,
    request: &[u8],
    within: Duration,
) -> (Vec<u8>, bool) {
    let mut s = sock.connect(addr).await.unwrap();
    let _ = s.write_all(request).await;
    let mut out = Vec::new();
    let r = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    (out, r.is_ok())
}

/// User plus system CPU ticks of this process, from `/proc/self/stat` opened beforehand.
fn cpu_ticks(stat: &std::fs::File) -> u64 {
    let mut buf = vec![0u8; 4096];
    let n = stat.read_at(&mut buf, 0).unwrap();
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    let rest = &text[text.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_out_of_fds_still_answers_and_metrics_still_work() {
    let t = common::start_with(
        "[admin]\naddress = \"127.0.0.1:0\"\n\
         [limits]\nheader_read_timeout = \"60s\"\nkeepalive_timeout = \"60s\"\n",
        |dir| std::fs::write(dir.join("site/index.html"), "hello").unwrap(),
    );
    let (tls, plain, admin) = (t.addrs[0], t.addrs[1], t.admin.unwrap());
    // sockets for the probes and the clock, made while fds are there
    let socks: Vec<TcpSocket> = (0..8).map(|_| TcpSocket::new_v4().unwrap()).collect();
    let mut socks = socks.into_iter();
    let stat = std::fs::File::open("/proc/self/stat").unwrap();
    // this process (server and clients) gets 24 more fds than it has, and takes them all
    let limit = open_fds() as u64 + 24;
    // SAFETY: setrlimit with a valid resource and a pointer to a local struct.
    let r = unsafe {
        libc::setrlimit(
            libc::RLIMIT_NOFILE,
            &libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            },
        )
    };
    assert_eq!(r, 0);
    let mut held = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline);
        match TcpStream::connect(plain).await {
            Ok(s) => held.push(s),
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => break,
            Err(e) => panic!("{e}"),
        }
        // let the worker accept it (taking its fd)
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("out of fds with {} connections open", held.len());

    // a new plain connection: a 503 at once (not left in the backlog)
    let (got, ended) = exchange(socks.next().unwrap(), plain, GET, Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&got).into_owned();
    eprintln!("plain, out of fds: {text:?}");
    assert!(
        ended,
        "a connection to a worker out of fds was left hanging"
    );
    assert!(text.starts_with("HTTP/1.1 503"), "{text:?}");

    // a TLS connection: closed at once
    let (_, ended) = exchange(
        socks.next().unwrap(),
        tls,
        b"\x16\x03\x01\x00\x05hello",
        Duration::from_secs(5),
    )
    .await;
    assert!(
        ended,
        "a TLS connection to a worker out of fds was left hanging"
    );

    // the admin listener still serves /metrics
    let (got, ended) = exchange(
        socks.next().unwrap(),
        admin,
        b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    let text = String::from_utf8_lossy(&got).into_owned();
    assert!(ended && text.starts_with("HTTP/1.1 200"), "{text:?}");
    assert!(text.contains("qweb_"), "{text}");

    // still out of fds, nobody spins: under a quarter of a CPU over a second
    let before = cpu_ticks(&stat);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ticks = cpu_ticks(&stat) - before;
    // SAFETY: sysconf with a valid name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    assert!(ticks * 4 < hz, "{ticks} CPU ticks in a second (of {hz})");

    // fds free again: served as usual
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (got, _) = exchange(
            TcpSocket::new_v4().unwrap(),
            plain,
            GET,
            Duration::from_secs(5),
        )
        .await;
        if got.starts_with(b"HTTP/1.1 200") {
            assert!(got.ends_with(b"hello"));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{:?}",
            String::from_utf8_lossy(&got)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
