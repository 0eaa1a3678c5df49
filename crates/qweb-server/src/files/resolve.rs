//! Mapping a request path to a path relative to the document root, refusing every way out
//! of it by name: `..` segments (also percent-encoded), backslashes, NUL bytes. Symlinks are
//! the opener's business (`open.rs`).

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use http::StatusCode;

/// Decodes a request path into the relative filesystem path it names, or the status that
/// refuses it. Percent-decoding happens before splitting, so `%2e%2e` and `%2F` cannot
/// smuggle a `..` segment or a separator past the checks.
pub(crate) fn decode(raw_path: &str) -> Result<PathBuf, StatusCode> {
    if !raw_path.starts_with('/') {
        return Err(StatusCode::BAD_REQUEST);
    }
    let bytes: Vec<u8> = percent_encoding::percent_decode_str(raw_path).collect();
    if bytes.iter().any(|&b| b == 0 || b == b'\\') {
        return Err(StatusCode::BAD_REQUEST);
    }
    let mut rel = PathBuf::new();
    for seg in bytes.split(|&b| b == b'/') {
        match seg {
            b"" | b"." => {}
            b".." => return Err(StatusCode::BAD_REQUEST),
            s => rel.push(OsStr::from_bytes(s)),
        }
    }
    Ok(rel)
}

/// The status for a filesystem error.
/// `EXDEV` (the path left the root) and `ELOOP` (a symlink the route refuses, or a loop) are
/// 403; permissions are 403; everything else (missing, not a directory) is 404.
pub(crate) fn io_status(e: io::Error) -> StatusCode {
    match (e.raw_os_error(), e.kind()) {
        (Some(libc::EXDEV | libc::ELOOP), _) | (_, io::ErrorKind::PermissionDenied) => {
            StatusCode::FORBIDDEN
        }
        _ => StatusCode::NOT_FOUND,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_refuses_escapes() {
        assert_eq!(decode("/a/b.txt").unwrap(), PathBuf::from("a/b.txt"));
        assert_eq!(decode("/a//./b").unwrap(), PathBuf::from("a/b"));
        assert_eq!(decode("/a%20b").unwrap(), PathBuf::from("a b"));
        for bad in [
            "/../etc/passwd",
            "/a/../../b",
            "/%2e%2e/etc/passwd",
            "/%2E%2E%2Fetc",
            "/a%2f..%2f..%2fb",
            "/a\\..\\b",
            "/a%5c..%5cb",
            "/a%00b",
            "relative",
        ] {
            assert_eq!(decode(bad), Err(StatusCode::BAD_REQUEST), "{bad}");
        }
    }
}
