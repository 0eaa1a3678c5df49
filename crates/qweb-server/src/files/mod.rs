//! Static files: GET and HEAD, index files, redirects for directories, Content-Type, ETag and
//! Last-Modified, conditional requests (304/412), byte ranges (206, `multipart/byteranges`
//! for several, 416).

mod autoindex;
pub(crate) mod body;
mod byteranges;
pub(crate) mod cache;
mod conditional;
mod open;
pub(crate) mod range;
mod resolve;

use std::fs::{File, Metadata};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Response, StatusCode};

use crate::config::StaticConfig;
pub(crate) use body::FileBody;
use cache::{FileHead, Identity};
pub(crate) use conditional::entity_tags;
use conditional::Outcome;
pub(crate) use open::Root;
use qweb_http::body::{empty, full, Body};
use qweb_http::response;
use qweb_session::ReadAhead;
use range::RangeRequest;

/// Files this small are read whole into one buffer.
const SMALL: u64 = 64 * 1024;

/// One static route on one worker.
pub(crate) struct StaticFiles {
    /// The root's directory fd: every file is opened beneath it.
    root: Arc<Root>,
    /// The root's path as configured (names files for Content-Type and the compression
    /// layer's cache; never opened by).
    root_path: PathBuf,
    index: String,
}

impl StaticFiles {
    /// Opens `cfg.root` (which must be a directory) once; requests open files beneath it.
    /// Replacing the root directory itself (say, a `current` symlink switched to a new
    /// release) takes effect when the workers are started again.
    pub(crate) fn new(cfg: &StaticConfig) -> std::io::Result<Self> {
        Ok(StaticFiles {
            root: Arc::new(Root::open_dir(&cfg.root, cfg.symlinks, cfg.open_method)?),
            root_path: cfg.root.clone(),
            index: cfg.index.clone(),
        })
    }

    /// Serves `path` (the part of the request path this route maps; starts with `/`).
    /// `mount` is what precedes `path` in the request path (the route prefix when it was
    /// stripped, else empty): redirects point at `mount + path + "/"`. `query` is kept on
    /// redirects. Small files come from this worker's open-file cache ([`cache`]). With
    /// `identify`, a file's response carries which file it is ([`StaticFile`]), for a later
    /// phase that opens its siblings (compression's sidecars and variant cache); attaching it
    /// costs about 4 % of a small cached request's instructions, so only callers that need it
    /// ask.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn serve(
        &self,
        method: &Method,
        headers: &HeaderMap,
        mount: &str,
        path: &str,
        query: Option<&str>,
        ahead: &ReadAhead,
        identify: bool,
    ) -> Response<Body> {
        if method != Method::GET && method != Method::HEAD {
            return response::method_not_allowed("GET, HEAD");
        }
        let opened = match cache::lookup(self.root.id(), path) {
            cache::Lookup::Fresh(e) => return self.respond_cached(method, headers, &e, identify),
            cache::Lookup::Stale(e) => {
                let opened = self.open(path, mount, query);
                match &opened {
                    Ok(Opened::File(_, meta, _)) if Identity::of(meta) == e.head.identity => {
                        cache::revalidated(&e);
                        return self.respond_cached(method, headers, &e, identify);
                    }
                    _ => cache::invalidate(&e),
                }
                opened
            }
            cache::Lookup::Miss => self.open(path, mount, query),
        };
        match opened {
            Ok(Opened::File(file, meta, rel)) => {
                match self.serve_file(method, headers, path, (file, ahead), &meta, rel, identify) {
                    Ok(r) => r,
                    Err(code) => response::status(code),
                }
            }
            Ok(Opened::Redirect(r)) => r,
            Err(code) => response::status(code),
        }
    }

    fn respond_cached(
        &self,
        method: &Method,
        headers: &HeaderMap,
        e: &cache::Entry,
        identify: bool,
    ) -> Response<Body> {
        self.respond(
            method,
            headers,
            &e.head,
            Source::Memory(e.body.clone()),
            identify,
        )
        .unwrap_or_else(response::status)
    }

    /// The regular file `path` names (a directory's index file), opened beneath the root, its
    /// metadata (of the opened fd) and its path relative to the root.
    fn open(&self, path: &str, mount: &str, query: Option<&str>) -> Result<Opened, StatusCode> {
        let rel = resolve::decode(path)?;
        let file = self.root.open(&rel).map_err(resolve::io_status)?;
        let meta = file.metadata().map_err(resolve::io_status)?;
        if meta.is_file() {
            // `/file/` names a directory that is not there
            if path.ends_with('/') {
                return Err(StatusCode::NOT_FOUND);
            }
            return Ok(Opened::File(file, meta, rel));
        }
        if !meta.is_dir() {
            // FIFOs, sockets, devices: opened O_NONBLOCK, never read
            return Err(StatusCode::FORBIDDEN);
        }
        if !path.ends_with('/') {
            return Ok(Opened::Redirect(redirect_to_dir(
                &format!("{mount}{path}"),
                query,
            )));
        }
        // a directory without an index (or whose index is not a regular file): no listings
        let index = self
            .root
            .open_in(&file, &rel, &self.index)
            .map_err(|_| StatusCode::FORBIDDEN)?;
        drop(file);
        let meta = index.metadata().map_err(|_| StatusCode::FORBIDDEN)?;
        if !meta.is_file() {
            return Err(StatusCode::FORBIDDEN);
        }
        Ok(Opened::File(index, meta, rel.join(&self.index)))
    }

    /// The headers of the opened file `rel`.
    fn head(&self, meta: &Metadata, rel: PathBuf) -> FileHead {
        let path: Arc<Path> = self.root_path.join(&rel).into();
        let mtime = meta.modified().unwrap_or(UNIX_EPOCH);
        let mut head = FileHead {
            len: meta.len(),
            mtime,
            etag: HeaderValue::from_str(&etag(meta, mtime))
                .unwrap_or(HeaderValue::from_static("\"0\"")),
            last_modified: HeaderValue::from_str(&httpdate::fmt_http_date(mtime)).ok(),
            content_type: content_type(&path),
            path,
            rel: rel.into(),
            identity: Identity::of(meta),
            fields: HeaderMap::new(),
        };
        head.fields = head.full_fields();
        head
    }

    /// Serves an opened file: whole from memory when small (and kept in the open-file cache
    /// when it admits the size), else streamed from `file`.
    #[allow(clippy::too_many_arguments)]
    fn serve_file(
        &self,
        method: &Method,
        headers: &HeaderMap,
        key: &str,
        (file, ahead): (File, &ReadAhead),
        meta: &Metadata,
        rel: PathBuf,
        identify: bool,
    ) -> Result<Response<Body>, StatusCode> {
        let head = self.head(meta, rel);
        if cache::admits(head.len) {
            let body = read_whole(&file, 0, head.len)?;
            drop(file);
            let e = cache::insert(self.root.id(), key, head, body);
            let body = Source::Memory(e.body.clone());
            return self.respond(method, headers, &e.head, body, identify);
        }
        self.respond(
            method,
            headers,
            &head,
            Source::File(file, ahead.clone()),
            identify,
        )
    }

    /// The response for `head` (status by the request's conditions and range), its body
    /// from `source`; with `identify`, carrying [`StaticFile`].
    fn respond(
        &self,
        method: &Method,
        headers: &HeaderMap,
        head: &FileHead,
        source: Source,
        identify: bool,
    ) -> Result<Response<Body>, StatusCode> {
        let len = head.len;
        // a whole 200's fields, cloned: the other answers change them
        let mut h = head.fields.clone();
        let etag = head.etag.to_str().unwrap_or_default();
        let range_allowed = match conditional::evaluate(headers, etag, head.mtime) {
            Outcome::NotModified => {
                h.remove(header::CONTENT_TYPE);
                h.remove(header::ACCEPT_RANGES);
                h.remove(header::CONTENT_LENGTH);
                return Ok(with_headers(StatusCode::NOT_MODIFIED, h, empty()));
            }
            Outcome::Failed => return Err(StatusCode::PRECONDITION_FAILED),
            Outcome::Proceed { range_allowed } => range_allowed,
        };

        let range = match headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
            Some(v) if range_allowed => range::parse(v, len),
            _ => RangeRequest::Full,
        };
        // for the compression layer (variant cache, sidecars)
        let info = identify.then(|| StaticFile {
            path: head.path.clone(),
            root: self.root.clone(),
            rel: head.rel.clone(),
            len,
            mtime: head.mtime,
        });
        let (status, start, count) = match range {
            RangeRequest::Full => (StatusCode::OK, 0, len),
            RangeRequest::Multi(ranges) => {
                let parts = match source {
                    _ if method == Method::HEAD => None,
                    Source::Memory(bytes) => Some(byteranges::PartSource::Memory(bytes)),
                    Source::File(file, ahead) => {
                        let (root, rel, identity) =
                            (self.root.clone(), head.rel.clone(), head.identity);
                        let reopen = move || body::Reopen {
                            root: root.clone(),
                            rel: rel.clone(),
                            identity,
                        };
                        Some(byteranges::file_parts(file, reopen, ahead))
                    }
                };
                let body = byteranges::respond(&mut h, &head.content_type, &ranges, len, parts);
                let r = with_headers(StatusCode::PARTIAL_CONTENT, h, body.unwrap_or_else(empty));
                return Ok(with_file(r, info));
            }
            RangeRequest::Partial { start, end } => {
                let cr = format!("bytes {start}-{end}/{len}");
                if let Ok(v) = HeaderValue::from_str(&cr) {
                    h.insert(header::CONTENT_RANGE, v);
                }
                (StatusCode::PARTIAL_CONTENT, start, end - start + 1)
            }
            RangeRequest::Unsatisfiable => {
                let mut r = response::status(StatusCode::RANGE_NOT_SATISFIABLE);
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                    r.headers_mut().insert(header::CONTENT_RANGE, v);
                }
                return Ok(r);
            }
        };
        if count != len {
            h.insert(header::CONTENT_LENGTH, HeaderValue::from(count));
        }
        if method == Method::HEAD {
            return Ok(with_file(with_headers(status, h, empty()), info));
        }
        let body = match source {
            Source::Memory(bytes) => {
                let (start, end) = (start as usize, (start + count) as usize);
                full(bytes.slice(start..end.min(bytes.len())))
            }
            Source::File(file, _) if count <= SMALL => full(read_whole(&file, start, count)?),
            Source::File(file, ahead) => {
                let source = body::Reopen {
                    root: self.root.clone(),
                    rel: head.rel.clone(),
                    identity: head.identity,
                };
                qweb_http::body::boxed(FileBody::new(file, source, start, count, ahead))
            }
        };
        Ok(with_file(with_headers(status, h, body), info))
    }
}

/// Attached by the static file handler to the responses it makes: which file, as it was
/// when it was opened.
#[derive(Debug, Clone)]
pub(crate) struct StaticFile {
    /// The root's path joined with `rel` (names the file in the variant cache).
    pub path: Arc<Path>,
    /// The route's root: sidecars are opened beneath it, by the route's symlink rules.
    pub root: Arc<Root>,
    /// The file's path relative to the root.
    pub rel: Arc<Path>,
    pub len: u64,
    pub mtime: SystemTime,
}

/// Where a response's body comes from.
enum Source {
    /// The whole file, in memory.
    Memory(Bytes),
    /// The opened file (streamed, or read whole when the part sent is small), and the
    /// response's share of its connection's read-ahead.
    File(File, ReadAhead),
}

/// What a request path led to.
enum Opened {
    /// A regular file, its metadata and its path relative to the root.
    File(File, Metadata, PathBuf),
    /// A directory named without its trailing slash.
    Redirect(Response<Body>),
}

fn with_file(mut r: Response<Body>, info: Option<StaticFile>) -> Response<Body> {
    if let Some(info) = info {
        r.extensions_mut().insert(info);
    }
    r
}

/// `count` bytes of `file` from `at` (a file that shrank meanwhile is a 500).
fn read_whole(file: &File, at: u64, count: u64) -> Result<Bytes, StatusCode> {
    body::read_exact_at(file, count as usize, at)
        .map(Bytes::from)
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)
}

fn with_headers(status: StatusCode, headers: HeaderMap, body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    r
}

/// 301 to `path/` (query kept).
pub(crate) fn redirect_to_dir(path: &str, query: Option<&str>) -> Response<Body> {
    // `//host/dir` must not become `Location: //host/dir/`, which a browser reads as a
    // scheme-relative URL (another host): an open redirect. One leading slash is kept.
    let path = format!("/{}", path.trim_start_matches('/'));
    let location = match query {
        Some(q) => format!("{path}/?{q}"),
        None => format!("{path}/"),
    };
    let mut r = response::status(StatusCode::MOVED_PERMANENTLY);
    if let Ok(v) = HeaderValue::from_str(&location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// `"<mtime in ns, hex>-<size, hex>"`: changes when the file is rewritten.
fn etag(meta: &Metadata, mtime: SystemTime) -> String {
    let ns = mtime
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("\"{:x}-{:x}\"", ns, meta.len())
}

fn content_type(path: &Path) -> HeaderValue {
    // No charset parameter (as nginx): the page's own `<meta charset>` decides, unless the
    // route or site sets `charset` (see `headers_rules::charset` in the pipeline).
    let mime = mime_guess::from_path(path).first_or_octet_stream();
    HeaderValue::from_str(mime.as_ref())
        .unwrap_or(HeaderValue::from_static("application/octet-stream"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{OpenMethod, StaticConfig, Symlinks};

    /// A file's response says which file it is only when asked (`identify`), for the cached
    /// path and the streamed one alike: the extension costs allocations on every request.
    #[test]
    fn responses_carry_the_file_only_when_asked() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("small.txt"), b"hello").unwrap();
        std::fs::write(t.path().join("big.bin"), vec![7u8; 200 * 1024]).unwrap();
        let files = StaticFiles::new(&StaticConfig {
            root: t.path().to_path_buf(),
            index: "index.html".into(),
            symlinks: Symlinks::InsideRoot,
            open_method: OpenMethod::Auto,
        })
        .unwrap();
        let ahead = ReadAhead::default();
        let h = HeaderMap::new();
        // twice each: a miss, then (for the small file) a hit of the open-file cache
        for path in ["/small.txt", "/small.txt", "/big.bin", "/big.bin"] {
            for identify in [false, true] {
                let r = files.serve(&Method::GET, &h, "", path, None, &ahead, identify);
                assert_eq!(r.status(), StatusCode::OK, "{path}");
                let info = r.extensions().get::<StaticFile>();
                assert_eq!(info.is_some(), identify, "{path}, identify = {identify}");
                if let Some(f) = info {
                    assert_eq!(&*f.rel, Path::new(&path[1..]));
                }
            }
        }
    }
}
