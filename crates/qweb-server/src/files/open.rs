//! Opening files beneath a static root, atomically.
//!
//! The root is opened once (a directory fd, per worker and route) and every file is opened
//! relative to it, never by a path that was checked earlier: a directory swapped for a symlink
//! between a check and an open cannot lead outside, because there is no separate check.
//!
//! - `symlinks = "inside_root"`: `openat2(RESOLVE_BENEATH)`; the kernel refuses (`EXDEV`)
//!   every resolution that leaves the root, including absolute symlinks (even ones pointing
//!   inside) and `..` in a symlink's target that climbs above the root.
//! - `symlinks = "refuse"`: `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` (`ELOOP` on any symlink).
//! - `symlinks = "follow"`: a plain `openat` from the root fd; symlinks lead anywhere.
//!
//! Where `openat2` is unavailable (`ENOSYS` on kernels before 5.6, `EPERM` under seccomp
//! filters that do not know it), the same rules are applied by a walk: one
//! `openat(O_NOFOLLOW)` per component from the root fd; a symlink met on the way is read
//! (`readlinkat`) and its target's components are walked in its place, `..` pops the walk's
//! own stack of directory fds (never the kernel's `..`), and popping past the start or an
//! absolute target is `EXDEV`. Which one is used is probed once per process.
//!
//! Every open is `O_NONBLOCK` (a FIFO swapped in never blocks the worker) and `O_CLOEXEC`; the
//! caller checks the opened fd's type with `fstat`.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::config::{OpenMethod, Symlinks};

/// Symlinks followed by one open (Linux's own limit, `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// How often an `openat2` that raced with a rename (`EAGAIN`) is retried.
const EAGAIN_RETRIES: usize = 4;

/// The mechanism in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    Openat2,
    Walk,
}

/// A static route's document root, opened.
#[derive(Debug)]
pub(crate) struct Root {
    /// Unique in the process (the open-file cache's key), never reused.
    id: u64,
    dir: OwnedFd,
    symlinks: Symlinks,
    how: How,
}

impl Root {
    /// Opens the directory `path` (symlinks in `path` itself are followed, once, now).
    pub(crate) fn open_dir(
        path: &Path,
        symlinks: Symlinks,
        method: OpenMethod,
    ) -> io::Result<Root> {
        let dir = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let how = match method {
            OpenMethod::Walk => How::Walk,
            OpenMethod::Auto if openat2_works(dir.as_fd()) => How::Openat2,
            OpenMethod::Auto => How::Walk,
        };
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Root {
            id,
            dir,
            symlinks,
            how,
        })
    }

    /// This root's id: unique in the process, never reused (not even after a reload).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Opens `rel` (relative, without `..`: what `resolve::decode` returns; empty is the root
    /// itself) beneath the root, by the route's symlink rules.
    pub(crate) fn open(&self, rel: &Path) -> io::Result<File> {
        self.open_from(self.dir.as_fd(), rel)
    }

    /// Opens `name` in `dir`, a directory opened by [`Root::open`] at `dir_rel`: beneath `dir`
    /// first (the usual case: one open, no second walk from the root); when that resolution
    /// leaves `dir` (a symlink to `../x`), again from the root as `dir_rel/name`, so that the
    /// result is beneath the root either way.
    pub(crate) fn open_in(&self, dir: &File, dir_rel: &Path, name: &str) -> io::Result<File> {
        match self.open_from(dir.as_fd(), Path::new(name)) {
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => self.open(&dir_rel.join(name)),
            r => r,
        }
    }

    fn open_from(&self, start: BorrowedFd<'_>, rel: &Path) -> io::Result<File> {
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let fd = match (self.symlinks, self.how) {
            (Symlinks::Follow, _) => rustix::fs::openat(start, rel, flags(), Mode::empty())?,
            (s, How::Openat2) => {
                let resolve = match s {
                    Symlinks::Refuse => ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
                    _ => ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
                };
                openat2_retrying(start, rel, resolve)?
            }
            (s, How::Walk) => walk(start, rel, s == Symlinks::Refuse)?,
        };
        Ok(File::from(fd))
    }
}

/// Flags of every open: read-only, never blocking (FIFOs), never inherited, never a
/// controlling terminal.
fn flags() -> OFlags {
    OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY
}

fn openat2_retrying(
    start: BorrowedFd<'_>,
    rel: &Path,
    resolve: ResolveFlags,
) -> io::Result<OwnedFd> {
    let mut tries = 0;
    loop {
        match rustix::fs::openat2(start, rel, flags(), Mode::empty(), resolve) {
            // a rename elsewhere raced with the lookup: the kernel asks to try again
            Err(Errno::AGAIN) if tries < EAGAIN_RETRIES => tries += 1,
            r => return Ok(r?),
        }
    }
}

/// Whether `openat2(RESOLVE_BENEATH)` works in this process (probed once, on `dir`).
fn openat2_works(dir: BorrowedFd<'_>) -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| {
        let r = rustix::fs::openat2(
            dir,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH,
        );
        let works = !matches!(r, Err(Errno::NOSYS) | Err(Errno::PERM));
        if !works {
            tracing::info!("openat2 is unavailable; static files are opened by a component walk");
        }
        works
    })
}

/// The fallback: `rel` walked one component at a time from `start` with `O_NOFOLLOW`, symlinks
/// resolved here (refused when `refuse`), never leaving `start` (`EXDEV`).
fn walk(start: BorrowedFd<'_>, rel: &Path, refuse: bool) -> io::Result<OwnedFd> {
    // Directories opened so far below `start` (the last is the current one), and the
    // components still to walk, last first.
    let mut dirs: Vec<OwnedFd> = Vec::new();
    let mut todo: Vec<Vec<u8>> = components(rel.as_os_str().as_bytes()).rev().collect();
    let mut links = 0;
    while let Some(name) = todo.pop() {
        let cur = dirs.last().map_or(start, |d| d.as_fd());
        match &name[..] {
            b"." => continue,
            b".." => {
                if dirs.pop().is_none() {
                    return Err(Errno::XDEV.into());
                }
                continue;
            }
            _ => {}
        }
        let last = todo.is_empty();
        let name_os = OsStr::from_bytes(&name);
        // Directories on the way are opened O_PATH (search permission is enough, as for
        // the kernel's own walk); with O_DIRECTORY | O_NOFOLLOW a symlink is ENOTDIR there,
        // and ELOOP as the last component.
        let f = if last {
            flags() | OFlags::NOFOLLOW
        } else {
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
        };
        let err = match rustix::fs::openat(cur, name_os, f, Mode::empty()) {
            Ok(fd) if last => return Ok(fd),
            Ok(fd) => {
                dirs.push(fd);
                continue;
            }
            Err(e) => e,
        };
        if err != Errno::LOOP && (last || err != Errno::NOTDIR) {
            return Err(err.into());
        }
        // a symlink? (EINVAL: not one, the original error stands)
        let target = match rustix::fs::readlinkat(cur, name_os, Vec::new()) {
            Ok(t) => t,
            Err(Errno::INVAL) => return Err(err.into()),
            Err(e) => return Err(e.into()),
        };
        links += 1;
        if refuse || links > MAX_LINKS {
            return Err(Errno::LOOP.into());
        }
        let target = target.as_bytes();
        if target.first() == Some(&b'/') {
            // as RESOLVE_BENEATH: absolute targets are refused
            return Err(Errno::XDEV.into());
        }
        todo.extend(components(target).rev());
    }
    // the path ended on `.` or `..` (or was empty): the current directory itself
    let cur = dirs.last().map_or(start, |d| d.as_fd());
    Ok(rustix::fs::openat(cur, ".", flags(), Mode::empty())?)
}

/// The non-empty components of a relative path.
fn components(path: &[u8]) -> impl DoubleEndedIterator<Item = Vec<u8>> + '_ {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty())
        .map(<[u8]>::to_vec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::{symlink, FileTypeExt};

    const METHODS: [OpenMethod; 2] = [OpenMethod::Auto, OpenMethod::Walk];

    /// `<tmp>/root` with files, directories and symlinks of every kind; `<tmp>/out` beside it.
    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        let out = t.path().join("out");
        for d in ["a/b", "c"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(root.join("top.txt"), "top").unwrap();
        std::fs::write(root.join("a/b/page.txt"), "page").unwrap();
        std::fs::write(out.join("secret"), "secret").unwrap();
        symlink("top.txt", root.join("rel-file")).unwrap();
        symlink("a/b", root.join("rel-dir")).unwrap();
        symlink("../../top.txt", root.join("a/b/up")).unwrap();
        symlink("../b/../../c/../top.txt", root.join("a/b/zigzag")).unwrap();
        symlink(root.join("top.txt"), root.join("abs-inside")).unwrap();
        symlink(out.join("secret"), root.join("abs-out")).unwrap();
        symlink("../out/secret", root.join("rel-out")).unwrap();
        symlink("../out", root.join("rel-out-dir")).unwrap();
        symlink("loop", root.join("loop")).unwrap();
        symlink("missing", root.join("dangling")).unwrap();
        symlink("rel-dir/..", root.join("dotdot-end")).unwrap();
        t
    }

    fn read(r: io::Result<File>) -> Result<String, i32> {
        match r {
            Ok(mut f) => {
                let mut s = String::new();
                match f.read_to_string(&mut s) {
                    Ok(_) => Ok(s),
                    // a directory
                    Err(_) => Ok("<dir>".into()),
                }
            }
            Err(e) => Err(e.raw_os_error().unwrap_or(0)),
        }
    }

    #[test]
    fn opener_table() {
        use Symlinks::*;
        let t = tree();
        let root = t.path().join("root");
        let ok = |s: &str| Ok::<String, i32>(s.to_owned());
        let (xdev, lp, noent) = (Err(libc::EXDEV), Err(libc::ELOOP), Err(libc::ENOENT));
        #[rustfmt::skip]
        let table: &[(&str, [Result<String, i32>; 3])] = &[
            //  path               inside_root        refuse           follow
            ("top.txt",          [ok("top"),        ok("top"),       ok("top")]),
            ("a/b/page.txt",     [ok("page"),       ok("page"),      ok("page")]),
            ("",                 [ok("<dir>"),      ok("<dir>"),     ok("<dir>")]),
            ("a/b",              [ok("<dir>"),      ok("<dir>"),     ok("<dir>")]),
            ("rel-file",         [ok("top"),        lp.clone(),      ok("top")]),
            ("rel-dir/page.txt", [ok("page"),       lp.clone(),      ok("page")]),
            ("a/b/up",           [ok("top"),        lp.clone(),      ok("top")]),
            ("a/b/zigzag",       [ok("top"),        lp.clone(),      ok("top")]),
            ("dotdot-end",       [ok("<dir>"),      lp.clone(),      ok("<dir>")]),
            ("abs-inside",       [xdev.clone(),     lp.clone(),      ok("top")]),
            ("abs-out",          [xdev.clone(),     lp.clone(),      ok("secret")]),
            ("rel-out",          [xdev.clone(),     lp.clone(),      ok("secret")]),
            ("rel-out-dir/secret", [xdev.clone(),   lp.clone(),      ok("secret")]),
            ("loop",             [lp.clone(),       lp.clone(),      lp.clone()]),
            ("missing",          [noent.clone(),    noent.clone(),   noent.clone()]),
            ("dangling",         [noent.clone(),    lp.clone(),      noent.clone()]),
            ("top.txt/x",        [Err(libc::ENOTDIR), Err(libc::ENOTDIR), Err(libc::ENOTDIR)]),
        ];
        for method in METHODS {
            for (i, mode) in [InsideRoot, Refuse, Follow].into_iter().enumerate() {
                let r = Root::open_dir(&root, mode, method).unwrap();
                for (path, want) in table {
                    let got = read(r.open(Path::new(path)));
                    assert_eq!(&got, &want[i], "{method:?} {mode:?} {path:?}");
                }
            }
        }
    }

    #[test]
    fn open_in_a_directory_stays_beneath_the_root() {
        let t = tree();
        let root = t.path().join("root");
        std::fs::write(root.join("c/home.html"), "home").unwrap();
        symlink("home.html", root.join("c/index.html")).unwrap();
        symlink("../top.txt", root.join("c/up.html")).unwrap();
        symlink("../../out/secret", root.join("c/out.html")).unwrap();
        for method in METHODS {
            let r = Root::open_dir(&root, Symlinks::InsideRoot, method).unwrap();
            let dir = r.open(Path::new("c")).unwrap();
            let c = Path::new("c");
            assert_eq!(read(r.open_in(&dir, c, "index.html")), Ok("home".into()));
            // leaves `c` but not the root: opened again from the root
            assert_eq!(read(r.open_in(&dir, c, "up.html")), Ok("top".into()));
            assert_eq!(
                read(r.open_in(&dir, c, "out.html")),
                Err(libc::EXDEV),
                "{method:?}"
            );
        }
    }

    #[test]
    #[allow(unsafe_code)]
    fn fifo_opens_without_blocking() {
        let t = tree();
        let root = t.path().join("root");
        let c = std::ffi::CString::new(root.join("pipe").as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        for method in METHODS {
            for mode in [Symlinks::InsideRoot, Symlinks::Refuse, Symlinks::Follow] {
                let r = Root::open_dir(&root, mode, method).unwrap();
                let f = r.open(Path::new("pipe")).unwrap();
                assert!(f.metadata().unwrap().file_type().is_fifo());
            }
        }
    }
}
