//! The peers qweb is measured against — nginx, h2o and Caddy — each with a configuration
//! generated from the same parameters as qweb's (workers, certificate, files, timeouts, access
//! logs off, resumption only where a row asks for it), and how to find (or install) its binary.

pub mod caddy;
pub mod h2o;
pub mod nginx;

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Error, Result};

/// A peer server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// nginx (Debian package `nginx`).
    Nginx,
    /// h2o (Debian package `h2o`).
    H2o,
    /// Caddy (Debian package `caddy`).
    Caddy,
}

impl Peer {
    /// Its name in tables and messages.
    pub fn name(self) -> &'static str {
        match self {
            Peer::Nginx => "nginx",
            Peer::H2o => "h2o",
            Peer::Caddy => "caddy",
        }
    }

    /// Where the Debian package puts the binary, and elsewhere it is often found.
    fn candidates(self) -> &'static [&'static str] {
        match self {
            Peer::Nginx => &["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"],
            Peer::H2o => &["/usr/bin/h2o", "/usr/local/bin/h2o", "/usr/sbin/h2o"],
            Peer::Caddy => &["/usr/bin/caddy", "/usr/local/bin/caddy"],
        }
    }

    /// The arguments that print the version.
    fn version_args(self) -> &'static [&'static str] {
        match self {
            Peer::Nginx => &["-v"],
            Peer::H2o => &["--version"],
            Peer::Caddy => &["version"],
        }
    }
}

/// A peer's binary and what its version command printed.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The binary.
    pub bin: PathBuf,
    /// Output of the version command, trimmed (first line).
    pub version_text: String,
}

fn command_output(program: &Path, args: &[&str]) -> Option<String> {
    let o = Command::new(program).args(args).output().ok()?;
    let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&o.stderr));
    Some(s)
}

/// The peer's binary: `explicit`, else the system's; when missing and `install` is true,
/// `apt-get update && apt-get install -y PACKAGE` first.
pub fn find(peer: Peer, explicit: Option<&Path>, install: bool) -> Result<PeerInfo> {
    let bin = match explicit {
        Some(p) if p.is_file() => p.to_path_buf(),
        Some(p) => {
            return Err(Error::Arg(format!(
                "--{} {}: no such file",
                peer.name(),
                p.display()
            )))
        }
        None => {
            let found = || {
                peer.candidates()
                    .iter()
                    .map(PathBuf::from)
                    .find(|p| p.is_file())
            };
            match found() {
                Some(p) => p,
                None if !install => {
                    return Err(Error::Other(format!(
                        "{} not installed (--no-install)",
                        peer.name()
                    )))
                }
                None => {
                    let pkg = peer.name();
                    eprintln!(
                        "qweb-bench: installing {pkg}: apt-get update && apt-get install -y {pkg}"
                    );
                    let st = Command::new("sh")
                        .args([
                            "-c",
                            &format!(
                                "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q {pkg}"
                            ),
                        ])
                        .status()
                        .map_err(|e| Error::io("run apt-get", e))?;
                    match found() {
                        Some(p) if st.success() => p,
                        _ => {
                            return Err(Error::Other(format!(
                                "apt-get install {pkg} failed ({st})"
                            )))
                        }
                    }
                }
            }
        }
    };
    let text = command_output(&bin, peer.version_args())
        .ok_or_else(|| Error::Other(format!("cannot run {} to ask its version", bin.display())))?;
    Ok(PeerInfo {
        bin,
        version_text: text.lines().next().unwrap_or("").trim().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_binary_that_is_not_there_is_refused_not_installed() {
        let e = find(Peer::Caddy, Some(Path::new("/nonexistent/caddy")), true)
            .expect_err("no such binary");
        assert!(e.to_string().contains("--caddy /nonexistent/caddy"), "{e}");
    }

    #[test]
    fn names_and_version_commands() {
        assert_eq!(Peer::H2o.name(), "h2o");
        assert_eq!(Peer::Nginx.version_args(), ["-v"]);
        assert!(Peer::Caddy.candidates().contains(&"/usr/bin/caddy"));
    }
}
