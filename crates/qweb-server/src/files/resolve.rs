//! Mapping a request path to a file under the document root, refusing every way out of it:
//! `..` segments (also percent-encoded), backslashes, NUL bytes, and symlinks whose target
//! lies outside the root.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

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

/// What a path resolved to.
#[derive(Debug)]
pub(crate) enum Target {
    /// A regular file (canonical path).
    File(PathBuf),
    /// A directory (canonical path).
    Dir(PathBuf),
}

/// Resolves `rel` under the canonical `root`, following symlinks only as long as the result
/// stays inside the root.
pub(crate) fn resolve(root: &Path, rel: &Path) -> Result<Target, StatusCode> {
    let joined = root.join(rel);
    let canonical = std::fs::canonicalize(&joined).map_err(io_status)?;
    if !canonical.starts_with(root) {
        return Err(StatusCode::FORBIDDEN);
    }
    let meta = std::fs::metadata(&canonical).map_err(io_status)?;
    if meta.is_dir() {
        Ok(Target::Dir(canonical))
    } else if meta.is_file() {
        Ok(Target::File(canonical))
    } else {
        // FIFOs, sockets, devices: never opened (a FIFO would block the worker).
        Err(StatusCode::FORBIDDEN)
    }
}

/// The status for a filesystem error.
pub(crate) fn io_status(e: io::Error) -> StatusCode {
    match e.kind() {
        io::ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
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

    #[test]
    fn symlink_out_of_root_is_forbidden() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        let root = tempfile::tempdir().unwrap();
        let root_c = std::fs::canonicalize(root.path()).unwrap();
        std::fs::write(root.path().join("ok"), "o").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("leak"))
            .unwrap();
        std::os::unix::fs::symlink(root.path().join("ok"), root.path().join("inside")).unwrap();
        assert!(matches!(
            resolve(&root_c, Path::new("ok")),
            Ok(Target::File(_))
        ));
        assert!(matches!(
            resolve(&root_c, Path::new("inside")),
            Ok(Target::File(_))
        ));
        assert_eq!(
            resolve(&root_c, Path::new("leak")).unwrap_err(),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            resolve(&root_c, Path::new("missing")).unwrap_err(),
            StatusCode::NOT_FOUND
        );
    }
}
