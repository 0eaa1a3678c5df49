//! External load generators and tracers the runner drives as child processes: `wrk`
//! (HTTP/1.1 keep-alive, plain and HTTPS with OpenSSL), `h2load` (HTTP/2 with many streams per
//! connection, from nghttp2) and `strace -c` (syscalls per request). Each module runs its tool
//! and parses the tool's own summary; every parse is unit tested against output captured from
//! the real tool (`fixtures/`).

pub mod h2load;
pub mod strace;
pub mod wrk;

use std::path::{Path, PathBuf};

/// What one external client run measured, after its checks.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ClientRun {
    /// The command line that ran.
    pub command: String,
    /// Requests completed (successful or not).
    pub requests: u64,
    /// Requests per second over the tool's own measured time.
    pub req_per_sec: f64,
    /// Response body MiB/s (h2load: data bytes; wrk: all bytes read, headers included).
    pub mib_per_sec: f64,
    /// Seconds the tool measured.
    pub secs: f64,
    /// What went wrong: non-2xx responses, socket errors, byte counts that do not add up.
    pub problems: Vec<String>,
    /// TLS version, cipher suite and key exchange the tool negotiated, when it says.
    pub tls: Option<String>,
}

/// What an OpenSSL client with default settings (as wrk's) negotiates with 127.0.0.1:`port`:
/// "TLSv1.3 TLS_AES_256_GCM_SHA384 X25519", from `openssl s_client -brief`.
pub fn openssl_negotiates(port: u16) -> Option<String> {
    let bin = find_tool("openssl")?;
    let out = std::process::Command::new(bin)
        .args([
            "s_client",
            "-brief",
            "-connect",
            &format!("127.0.0.1:{port}"),
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    parse_s_client_brief(&text)
}

/// "Protocol version: TLSv1.3", "Ciphersuite: X", "Server Temp Key: X25519, 253 bits" of
/// `openssl s_client -brief` as "TLSv1.3 X X25519".
pub fn parse_s_client_brief(text: &str) -> Option<String> {
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(k))
            .map(|v| v.trim().split([',', ' ']).next().unwrap_or("").to_string())
    };
    let mut parts = vec![field("Protocol version:")?, field("Ciphersuite:")?];
    parts.extend(field("Server Temp Key:").or_else(|| field("Peer Temp Key:")));
    Some(parts.join(" "))
}

/// `name` on PATH or in the usual system folders.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for d in ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"] {
        dirs.push(PathBuf::from(d));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| is_exe(p))
}

fn is_exe(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The first number in `s` (digits and one dot), e.g. "12.5k" → 12.5.
fn leading_number(s: &str) -> Option<f64> {
    let t: String = s
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    t.parse().ok()
}

/// The integer that follows `key` in `line` ("requests=12" with key "requests=").
fn int_after(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    let t: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    t.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn s_client_brief_names_version_cipher_and_group() {
        let t = "CONNECTION ESTABLISHED\nProtocol version: TLSv1.3\nCiphersuite: TLS_AES_256_GCM_SHA384\n\
                 Peer certificate: CN = localhost\nServer Temp Key: X25519, 253 bits\n";
        assert_eq!(
            super::parse_s_client_brief(t).as_deref(),
            Some("TLSv1.3 TLS_AES_256_GCM_SHA384 X25519")
        );
        assert_eq!(
            super::parse_s_client_brief("connect: Connection refused"),
            None
        );
    }
}
