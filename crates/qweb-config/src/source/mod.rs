//! The configuration's text: the main file, the files it includes (`include = [...]`), and the
//! environment variables in their string values, read into one tree of spanned values.
//!
//! Every file gets its own range of *global* byte offsets ([`Sources`]); the tree's spans are
//! global, so an error anywhere is turned back into the file, line and column it is about.
//!
//! - `include` (a top-level key, a string or an array of strings) names files relative to the
//!   file that includes them; a pattern with `*`, `?` or `[...]` in its last component is a
//!   glob, expanded in byte order of the names (names starting with `.` are not matched), and
//!   may match nothing; a plain path must exist. An included file may include others.
//! - An included file's tables merge into the includer's key by key, its arrays of tables
//!   (`[[listener]]`, `[[route]]`, `[[site]]`, `key = [{ ... }]`) are appended after the
//!   includer's, and any other key set in two files is an error naming both.
//! - Refused, with the include's file, line and column: a missing file, a folder or other
//!   non-regular file, a cycle (named file by file), the same file included twice, more than
//!   [`MAX_INCLUDE_DEPTH`] levels, more than [`MAX_CONFIG_FILES`] files, a file over
//!   [`MAX_CONFIG_FILE_SIZE`], a symlink loop, text that is not UTF-8.

pub(crate) mod de;
pub(crate) mod env;
pub(crate) mod tree;

use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::line_col;
use crate::ConfigError;
use tree::{Entry, Kind, Node};

/// How deep includes may nest (the main file is level 0): deeper is refused.
pub const MAX_INCLUDE_DEPTH: usize = 16;
/// How many files one configuration may read, the main file and every include together.
pub const MAX_CONFIG_FILES: usize = 1024;
/// The largest configuration file read (each file; 4 MiB).
pub const MAX_CONFIG_FILE_SIZE: u64 = 4 << 20;

/// One file of a configuration.
#[derive(Debug)]
struct SourceFile {
    /// `None`: text given without a file.
    path: Option<PathBuf>,
    text: String,
    /// Its first byte's global offset.
    base: usize,
}

/// The files of a configuration, each with its range of global offsets.
#[derive(Debug, Default)]
pub(crate) struct Sources {
    files: Vec<SourceFile>,
}

/// Where an include is written, for errors about it.
struct Site {
    span: Range<usize>,
    key: String,
}

impl Sources {
    /// The file holding global `offset`, and the offset within it.
    fn locate(&self, offset: usize) -> Option<(&SourceFile, usize)> {
        let f = self.files.iter().rev().find(|f| f.base <= offset)?;
        Some((f, offset - f.base))
    }

    /// An error at global `span` (or, without one, about the main file) about `key`.
    pub fn error(
        &self,
        span: Option<Range<usize>>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        let located = span.and_then(|s| self.locate(s.start));
        let (file, line, column) = match located {
            Some((f, off)) => {
                let (l, c) = line_col(&f.text, off);
                (f.path.clone(), l, c)
            }
            None => (self.files.first().and_then(|f| f.path.clone()), 0, 0),
        };
        ConfigError {
            file,
            line,
            column,
            key: key.into(),
            message: message.into(),
        }
    }

    /// `file:line:column` of a global offset, for messages that name a second place.
    pub fn place(&self, offset: usize) -> String {
        match self.locate(offset) {
            Some((f, off)) => {
                let (l, c) = line_col(&f.text, off);
                format!("{}:{l}:{c}", display(f.path.as_deref()))
            }
            None => "?".into(),
        }
    }

    /// The folder a path written at global `offset` is relative to: its file's folder (the
    /// current folder for text without a file).
    pub fn dir_of(&self, offset: usize) -> PathBuf {
        self.locate(offset)
            .and_then(|(f, _)| f.path.as_deref()?.parent().map(Path::to_owned))
            .unwrap_or_default()
    }

    /// Every file read, the main one first.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.files.iter().filter_map(|f| f.path.clone()).collect()
    }

    /// Each file's text with its base offset, for searches over the text (`span_of_key`).
    pub fn texts(&self) -> impl Iterator<Item = (&str, usize)> {
        self.files.iter().map(|f| (f.text.as_str(), f.base))
    }
}

fn display(p: Option<&Path>) -> String {
    p.map(|p| p.display().to_string())
        .unwrap_or_else(|| "<text>".into())
}

/// Reads `text` (the main file, at `file`) and everything it includes, with variables from
/// `env`, into one tree.
pub(crate) fn load(
    text: String,
    file: Option<&Path>,
    env: env::Lookup,
) -> Result<(Sources, Node), ConfigError> {
    let mut loader = Loader {
        sources: Sources::default(),
        env,
        stack: Vec::new(),
        seen: Vec::new(),
    };
    let canonical = file.and_then(|f| std::fs::canonicalize(f).ok());
    let root = loader.file(text, file.map(Path::to_owned), canonical, 0)?;
    Ok((loader.sources, root))
}

struct Loader<'a> {
    sources: Sources,
    env: env::Lookup<'a>,
    /// Canonical paths of the files being read, outermost first (for cycles).
    stack: Vec<PathBuf>,
    /// Canonical paths of every file read, with where it was included (for duplicates).
    seen: Vec<(PathBuf, usize)>,
}

impl Loader<'_> {
    /// Parses one file's text, expands its variables and merges its includes into it.
    fn file(
        &mut self,
        text: String,
        path: Option<PathBuf>,
        canonical: Option<PathBuf>,
        depth: usize,
    ) -> Result<Node, ConfigError> {
        let base = self
            .sources
            .files
            .last()
            .map(|f| f.base + f.text.len() + 1)
            .unwrap_or(0);
        let parsed = Kind::deserialize(toml::Deserializer::new(&text));
        self.sources.files.push(SourceFile { path, text, base });
        let kind = parsed.map_err(|e| {
            self.sources.error(
                e.span().map(|s| s.start + base..s.end + base),
                "",
                e.message().to_string(),
            )
        })?;
        let len = self.sources.files.last().map_or(0, |f| f.text.len());
        let mut root = Node {
            span: base..base + len,
            kind,
        };
        root.shift(base);
        self.expand(&mut root, String::new())?;
        let Some(entries) = root.entries_mut() else {
            return Ok(root);
        };
        let include = match entries.iter().position(|e| e.key == "include") {
            Some(i) => entries.remove(i),
            None => return Ok(root),
        };
        if let Some(c) = &canonical {
            self.stack.push(c.clone());
        }
        let dir = self.sources.dir_of(include.key_span.start);
        for (site, pattern) in self.patterns(include)? {
            for inc in self.glob(&dir, &pattern, &site)? {
                let sub = self.include(&inc, &site, depth + 1)?;
                let (Some(entries), Kind::Table(from)) = (root.entries_mut(), sub.kind) else {
                    continue;
                };
                tree::merge(entries, from, "").map_err(|c| {
                    self.sources.error(
                        Some(c.second.clone()),
                        c.key.clone(),
                        format!(
                            "`{}` is also set at {}: a key may be set in one file only \
                             (tables merge key by key, arrays of tables are appended)",
                            c.key,
                            self.sources.place(c.first.start)
                        ),
                    )
                })?;
            }
        }
        if canonical.is_some() {
            self.stack.pop();
        }
        Ok(root)
    }

    /// `include`'s patterns, each with where it is written.
    fn patterns(&self, include: Entry) -> Result<Vec<(Site, String)>, ConfigError> {
        let one = |n: Node, key: String| match n.kind {
            Kind::Str { value, .. } => Ok((Site { span: n.span, key }, value)),
            _ => Err(self.sources.error(
                Some(n.span.clone()),
                key,
                format!("a file or glob pattern, not {}", n.kind_name()),
            )),
        };
        match include.value.kind {
            Kind::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, n)| one(n, format!("include[{i}]")))
                .collect(),
            _ => Ok(vec![one(include.value, "include".into())?]),
        }
    }

    /// The files `pattern` names, relative to `dir`: the path itself, or the glob's matches
    /// in byte order.
    fn glob(&self, dir: &Path, pattern: &str, site: &Site) -> Result<Vec<PathBuf>, ConfigError> {
        let err = |m: String| self.sources.error(Some(site.span.clone()), &site.key, m);
        if pattern.is_empty() {
            return Err(err("an empty include path".into()));
        }
        let full = dir.join(pattern);
        let name = full
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let parent = full.parent().unwrap_or(Path::new("/"));
        let wild = |s: &str| s.contains(['*', '?', '[']);
        if wild(&parent.to_string_lossy()) && !parent.exists() {
            return Err(err(format!(
                "{pattern}: only the last component of an include may be a pattern"
            )));
        }
        if !wild(&name) {
            return Ok(vec![full]);
        }
        let read = match std::fs::read_dir(parent) {
            Ok(r) => r,
            // nothing to match, as a shell glob (and nginx's include) would say
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(err(format!("cannot list {}: {e}", parent.display()))),
        };
        let mut names: Vec<String> = Vec::new();
        for entry in read {
            let entry = entry.map_err(|e| err(format!("cannot list {}: {e}", parent.display())))?;
            let n = entry.file_name().to_string_lossy().into_owned();
            if !n.starts_with('.') && glob_match(name.as_bytes(), n.as_bytes()) {
                names.push(n);
            }
        }
        names.sort();
        Ok(names.into_iter().map(|n| parent.join(n)).collect())
    }

    /// Reads and loads one included file.
    fn include(&mut self, path: &Path, site: &Site, depth: usize) -> Result<Node, ConfigError> {
        let err = |s: &Sources, m: String| s.error(Some(site.span.clone()), &site.key, m);
        if depth > MAX_INCLUDE_DEPTH {
            return Err(err(
                &self.sources,
                format!(
                    "includes nest more than {MAX_INCLUDE_DEPTH} levels deep (at {})",
                    path.display()
                ),
            ));
        }
        if self.sources.files.len() >= MAX_CONFIG_FILES {
            return Err(err(
                &self.sources,
                format!(
                    "more than {MAX_CONFIG_FILES} configuration files (at {})",
                    path.display()
                ),
            ));
        }
        let canonical = std::fs::canonicalize(path).map_err(|e| {
            err(
                &self.sources,
                format!("cannot include {}: {e}", path.display()),
            )
        })?;
        if let Some(i) = self.stack.iter().position(|p| *p == canonical) {
            let cycle: Vec<String> = self.stack[i..]
                .iter()
                .chain([&canonical])
                .map(|p| p.display().to_string())
                .collect();
            return Err(err(
                &self.sources,
                format!("include cycle: {}", cycle.join(" -> ")),
            ));
        }
        if let Some((_, first)) = self.seen.iter().find(|(p, _)| *p == canonical) {
            return Err(err(
                &self.sources,
                format!(
                    "{} is already included at {}",
                    path.display(),
                    self.sources.place(*first)
                ),
            ));
        }
        self.seen.push((canonical.clone(), site.span.start));
        let text = read_limited(path).map_err(|m| err(&self.sources, m))?;
        self.file(text, Some(path.to_owned()), Some(canonical), depth)
    }

    /// Replaces the variable references in every string value of `node`.
    fn expand(&self, node: &mut Node, key: String) -> Result<(), ConfigError> {
        match &mut node.kind {
            Kind::Str { value, var } => match env::expand(value, self.env) {
                Ok(None) => Ok(()),
                Ok(Some(e)) => {
                    *value = e.value;
                    *var = e.whole;
                    Ok(())
                }
                Err(e) => Err(self.sources.error(
                    Some(self.reference_span(&node.span, &e)),
                    key,
                    e.message,
                )),
            },
            Kind::Array(items) => items
                .iter_mut()
                .enumerate()
                .try_for_each(|(i, n)| self.expand(n, format!("{key}[{i}]"))),
            Kind::Table(entries) => entries.iter_mut().try_for_each(|e| {
                let k = if key.is_empty() {
                    e.key.clone()
                } else {
                    format!("{key}.{}", e.key)
                };
                self.expand(&mut e.value, k)
            }),
            _ => Ok(()),
        }
    }

    /// Where a failed reference is written: its `${NAME` in the string's source text, else
    /// the string.
    fn reference_span(&self, span: &Range<usize>, e: &env::EnvError) -> Range<usize> {
        let Some((f, off)) = self.sources.locate(span.start) else {
            return span.clone();
        };
        let written = f.text.get(off..off + span.len()).unwrap_or("");
        let needle = format!("${{{}", e.name);
        match written.find(&needle) {
            Some(i) => span.start + i..span.start + i + needle.len(),
            None => span.clone(),
        }
    }
}

/// Reads a configuration file of at most [`MAX_CONFIG_FILE_SIZE`] bytes; a folder, a FIFO or
/// a device is refused (reading one would block or mean nothing).
pub(crate) fn read_limited(path: &Path) -> Result<String, String> {
    let shown = path.display();
    let f = std::fs::File::open(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let meta = f
        .metadata()
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    if meta.is_dir() {
        return Err(format!("{shown} is a folder, not a configuration file"));
    }
    if !meta.is_file() {
        return Err(format!("{shown} is not a regular file"));
    }
    let mut bytes = Vec::new();
    f.take(MAX_CONFIG_FILE_SIZE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    if bytes.len() as u64 > MAX_CONFIG_FILE_SIZE {
        return Err(format!(
            "{shown} is larger than {} MiB (MAX_CONFIG_FILE_SIZE)",
            MAX_CONFIG_FILE_SIZE >> 20
        ));
    }
    String::from_utf8(bytes).map_err(|e| format!("{shown} is not UTF-8 text: {e}"))
}

/// Shell-style match of one file name: `*` (any run), `?` (one byte), `[abc]`, `[a-z]`,
/// `[!x]`; no escapes (`[*]` matches a `*`).
pub(crate) fn glob_match(p: &[u8], n: &[u8]) -> bool {
    // iterative with one backtrack point for the last `*` (linear in practice, no recursion)
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, ni));
                pi += 1;
                continue;
            }
            Some(b'?') => {
                pi += 1;
                ni += 1;
                continue;
            }
            Some(b'[') => {
                if let Some((ok, len)) = class(&p[pi..], n[ni]) {
                    if ok {
                        pi += len;
                        ni += 1;
                        continue;
                    }
                } else if n[ni] == b'[' {
                    pi += 1;
                    ni += 1;
                    continue;
                }
            }
            Some(&c) if c == n[ni] => {
                pi += 1;
                ni += 1;
                continue;
            }
            _ => {}
        }
        match star {
            Some((sp, sn)) => {
                pi = sp + 1;
                ni = sn + 1;
                star = Some((sp, sn + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// A `[...]` class at the start of `p`: whether `c` is in it, and its length; `None` when it
/// is not closed (then `[` is literal).
fn class(p: &[u8], c: u8) -> Option<(bool, usize)> {
    let mut i = 1;
    let negate = matches!(p.get(1), Some(b'!') | Some(b'^'));
    if negate {
        i += 1;
    }
    let mut found = false;
    let mut first = true;
    while i < p.len() {
        if p[i] == b']' && !first {
            return Some((found != negate, i + 1));
        }
        first = false;
        if p.get(i + 1) == Some(&b'-') && p.get(i + 2).is_some_and(|&e| e != b']') {
            found |= (p[i]..=p[i + 2]).contains(&c);
            i += 3;
        } else {
            found |= p[i] == c;
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests;
