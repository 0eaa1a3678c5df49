//! The built-in welcome site, written to the state folder and served like any static root.

use std::io;
use std::path::Path;

const INDEX: &str = include_str!("welcome/index.html");

/// Writes the welcome site into `dir` (rewriting it only when its content changed, so its
/// ETag and Last-Modified stay stable across restarts).
pub(crate) fn install(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let index = dir.join("index.html");
    if std::fs::read(&index).ok().as_deref() != Some(INDEX.as_bytes()) {
        // a new file renamed into place: never written through a symlink planted there
        qweb_tls::state_file::write_replacing(&index, INDEX.as_bytes(), 0o644, |_| Ok(()))?;
    }
    Ok(())
}
