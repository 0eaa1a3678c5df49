//! The import graph of a crate's module files, read from its sources: the `crate::`,
//! `super::` and `self::` paths outside comments and string literals (`use` groups such as
//! `use super::{a, b::c}` and chains such as `super::super::x` included), each resolved
//! relative to the module it is written in (inline `mod name { .. }` blocks included) and
//! then to the file that defines the deepest module of the path. rustc cannot forbid an import
//! inside one crate, so the workspace's shape (qweb-server's layers, no cycle between the
//! files of any crate) is checked by tests that read this graph.
//!
//! What the scan does not see: paths that start at a child module's bare name (`child::x`
//! in its parent: a parent's use of its child is allowed anyway), names brought in by glob
//! imports or re-exports (an edge goes to the file that re-exports a name, not to the file
//! that defines it), and `#[path]` attributes (the workspace has none).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module file (its path beneath the crate's `src`, `/`-separated: `runtime/server.rs`) to
/// the module files it imports from (itself, its own parent and the crate roots left out).
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// One token of Rust source; comments, whitespace and the contents of literals are dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok<'a> {
    /// An identifier or keyword (`r#` of a raw identifier removed).
    Ident(&'a str),
    /// `::`
    Sep,
    /// A literal (string, char, number) or a lifetime.
    Lit,
    /// Any other punctuation character.
    Punct(char),
}

/// Splits `src` into tokens.
fn lex(src: &str) -> Vec<Tok<'_>> {
    let b = src.as_bytes();
    let n = b.len();
    let ident_start = |c: u8| c.is_ascii_alphabetic() || c == b'_';
    let ident_char = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    // The end of a raw string whose `r` is at `i` (`r"..."`, `r#"..."#`), if one starts there.
    let raw_string = |i: usize| -> Option<usize> {
        let mut j = i + 1;
        while j < n && b[j] == b'#' {
            j += 1;
        }
        if j >= n || b[j] != b'"' {
            return None;
        }
        let hashes = j - i - 1;
        j += 1;
        while j < n {
            if b[j] == b'"'
                && b.len() > j + hashes
                && b[j + 1..=j + hashes].iter().all(|&c| c == b'#')
            {
                return Some(j + 1 + hashes);
            }
            j += 1;
        }
        Some(n)
    };
    // The end of a quoted literal whose opening `quote` is at `i`, escapes honoured.
    let quoted = |i: usize, quote: u8| -> usize {
        let mut j = i + 1;
        while j < n {
            match b[j] {
                b'\\' => j += 2,
                c if c == quote => return j + 1,
                _ => j += 1,
            }
        }
        n
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < n {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < n && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0usize;
            while i < n {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == b'"' {
            i = quoted(i, b'"');
            out.push(Tok::Lit);
        } else if c == b'b' && b.get(i + 1) == Some(&b'"') {
            i = quoted(i + 1, b'"');
            out.push(Tok::Lit);
        } else if c == b'b' && b.get(i + 1) == Some(&b'\'') {
            i = quoted(i + 1, b'\'');
            out.push(Tok::Lit);
        } else if let Some(end) = (c == b'r').then(|| raw_string(i)).flatten().or_else(|| {
            (c == b'b' && b.get(i + 1) == Some(&b'r'))
                .then(|| raw_string(i + 1))
                .flatten()
        }) {
            i = end;
            out.push(Tok::Lit);
        } else if c == b'\'' {
            // A char literal (`'a'`, `'\n'`, `'\u{..}'`) or a lifetime (`'a`, `'static`).
            if b.get(i + 1) == Some(&b'\\') {
                i = quoted(i, b'\'');
            } else {
                let ch_len = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                if b.get(i + 1 + ch_len) == Some(&b'\'') {
                    i += 2 + ch_len;
                } else {
                    i += 1;
                    while i < n && ident_char(b[i]) {
                        i += 1;
                    }
                }
            }
            out.push(Tok::Lit);
        } else if c == b'r'
            && b.get(i + 1) == Some(&b'#')
            && b.get(i + 2).is_some_and(|&c| ident_start(c))
        {
            let start = i + 2;
            i = start;
            while i < n && ident_char(b[i]) {
                i += 1;
            }
            out.push(Tok::Ident(&src[start..i]));
        } else if ident_start(c) {
            let start = i;
            while i < n && ident_char(b[i]) {
                i += 1;
            }
            out.push(Tok::Ident(&src[start..i]));
        } else if c.is_ascii_digit() {
            while i < n && ident_char(b[i]) {
                i += 1;
            }
            out.push(Tok::Lit);
        } else if c == b':' && b.get(i + 1) == Some(&b':') {
            i += 2;
            out.push(Tok::Sep);
        } else if c.is_ascii() {
            i += 1;
            out.push(Tok::Punct(char::from(c)));
        } else {
            // Outside literals and comments, only in identifiers this scan need not read.
            i += 1;
        }
    }
    out
}

/// A path written in a source file, resolved against the crate root.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Found {
    /// The segments from the crate root (`["runtime", "server", "ServerError"]`).
    path: Vec<String>,
    /// Written as `crate::{..}` (a group straight after `crate::`).
    crate_group: bool,
    /// The first path of such a group.
    group_start: bool,
    /// Written from `crate::` (not `super::` or `self::`).
    from_crate: bool,
}

/// Reads the use tree or path that starts at `toks[*i]` (after its keyword prefix), with
/// `prefix` the module it starts from, and appends every path it names to `out`.
fn read_tree(
    toks: &[Tok<'_>],
    i: &mut usize,
    prefix: &[String],
    crate_group: bool,
    out: &mut Vec<Found>,
) {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(*i) {
            Some(Tok::Punct('{')) => {
                *i += 1;
                loop {
                    match toks.get(*i) {
                        None => return,
                        Some(Tok::Punct('}')) => {
                            *i += 1;
                            return;
                        }
                        Some(Tok::Punct(',')) => *i += 1,
                        Some(Tok::Ident("self")) => {
                            out.push(Found {
                                path: path.clone(),
                                crate_group,
                                group_start: false,
                                from_crate: false,
                            });
                            *i += 1;
                            skip_rename(toks, i);
                        }
                        Some(_) => read_tree(toks, i, &path, crate_group, out),
                    }
                }
            }
            Some(Tok::Punct('*')) => {
                *i += 1;
                break;
            }
            Some(Tok::Ident(name)) if !matches!(*name, "self" | "super" | "crate") => {
                path.push((*name).to_owned());
                *i += 1;
                if toks.get(*i) == Some(&Tok::Sep) {
                    *i += 1;
                    continue;
                }
                skip_rename(toks, i);
                break;
            }
            _ => {
                // Malformed, or a tree item this reader does not know: stop without a path
                // unless some segment was read.
                if path.len() == prefix.len() {
                    return;
                }
                break;
            }
        }
    }
    out.push(Found {
        path,
        crate_group,
        group_start: false,
        from_crate: false,
    });
}

/// Skips `as name` after a use tree.
fn skip_rename(toks: &[Tok<'_>], i: &mut usize) {
    if toks.get(*i) == Some(&Tok::Ident("as")) {
        *i += 2;
    }
}

/// The `crate::`, `super::` and `self::` paths of the source of module `module` (the
/// segments from the crate root to the file's module: `["runtime", "server"]` for
/// `runtime/server.rs`), resolved against the crate root, in order.
fn scan(module: &[String], toks: &[Tok<'_>]) -> Vec<Found> {
    let mut out = Vec::new();
    // One entry per open `{`: the inline module it opens, if it opens one.
    let mut braces: Vec<Option<String>> = Vec::new();
    let here = |braces: &[Option<String>]| -> Vec<String> {
        let mut m = module.to_vec();
        m.extend(braces.iter().flatten().cloned());
        m
    };
    let mut i = 0;
    while i < toks.len() {
        match toks[i] {
            Tok::Punct('{') => {
                let inline = match (
                    i.checked_sub(2).map(|j| toks[j]),
                    i.checked_sub(1).map(|j| toks[j]),
                ) {
                    (Some(Tok::Ident("mod")), Some(Tok::Ident(name))) => Some(name.to_owned()),
                    _ => None,
                };
                braces.push(inline);
                i += 1;
            }
            Tok::Punct('}') => {
                braces.pop();
                i += 1;
            }
            Tok::Ident(kw @ ("crate" | "super" | "self"))
                if toks.get(i + 1) == Some(&Tok::Sep)
                    && !(i > 0 && toks[i - 1] == Tok::Sep)
                    // `pub(in crate::x)` names a visibility, not an import
                    && !(i > 1 && toks[i - 1] == Tok::Ident("in") && toks[i - 2] == Tok::Punct('(')) =>
            {
                let mut base = match kw {
                    "crate" => Vec::new(),
                    _ => here(&braces),
                };
                if kw == "super" {
                    base.pop();
                }
                i += 2;
                while toks.get(i) == Some(&Tok::Ident("super"))
                    && toks.get(i + 1) == Some(&Tok::Sep)
                {
                    base.pop();
                    i += 2;
                }
                let crate_group = kw == "crate" && toks.get(i) == Some(&Tok::Punct('{'));
                let first = out.len();
                read_tree(toks, &mut i, &base, crate_group, &mut out);
                if let Some(f) = out.get_mut(first) {
                    f.group_start = crate_group;
                }
                for f in &mut out[first..] {
                    f.from_crate = kw == "crate";
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// Whether the tokens at `i` are the attribute `#[cfg(test)]` (`#![cfg(test)]` with `inner`).
fn is_cfg_test(toks: &[Tok<'_>], i: usize, inner: bool) -> bool {
    let attr = [
        Tok::Punct('['),
        Tok::Ident("cfg"),
        Tok::Punct('('),
        Tok::Ident("test"),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    let bang = usize::from(inner);
    toks.get(i) == Some(&Tok::Punct('#'))
        && (!inner || toks.get(i + 1) == Some(&Tok::Punct('!')))
        && toks.get(i + 1 + bang..i + 1 + bang + attr.len()) == Some(&attr[..])
}

/// The tokens with every item under `#[cfg(test)]` left out (a test may reach anywhere):
/// the attribute and what follows it up to a `;` outside braces or the `}` that closes the
/// item's first brace. None at all for a file that is `#![cfg(test)]`.
fn strip_tests<'a>(toks: &[Tok<'a>]) -> Vec<Tok<'a>> {
    if (0..toks.len()).any(|i| is_cfg_test(toks, i, true)) {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        if !is_cfg_test(toks, i, false) {
            out.push(toks[i]);
            i += 1;
            continue;
        }
        i += 7;
        let mut depth = 0usize;
        while i < toks.len() {
            match toks[i] {
                Tok::Punct('{') => depth += 1,
                // the block around the item closes: the item (an odd one) ended
                Tok::Punct('}') if depth == 0 => break,
                Tok::Punct('}') => {
                    depth -= 1;
                    if depth == 0 {
                        i += 1;
                        break;
                    }
                }
                Tok::Punct(';') if depth == 0 => {
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
    }
    out
}

/// The `crate::name` paths in `src`, in order, comments and string literals left out, by the
/// first segment after `crate::`. `crate::{` gives the entry `"{"` (followed by the first
/// segment of each path in the group), so that a caller can insist on one path per layer.
/// `super::` and `self::` paths need the file's place: see [`top_imports`].
pub fn imports(src: &str) -> Vec<String> {
    let mut found = scan(&[], &lex(src));
    found.retain(|f| f.from_crate);
    firsts(found)
}

/// Like [`imports`], with `super::` and `self::` paths resolved too: the top-level module
/// (first segment from the crate root) of every path in `src`, the source of the file `rel`
/// (its path beneath the crate's `src`), test code included. A path that climbs to the crate
/// root gives the name after it (`super::super::runtime::X` in `conn/h1.rs` gives `runtime`).
pub fn top_imports(rel: &Path, src: &str) -> Vec<String> {
    firsts(scan(&module_of(rel), &lex(src)))
}

/// The first segment of each path, `"{"` before the paths of each `crate::{..}` group.
fn firsts(found: Vec<Found>) -> Vec<String> {
    let mut out = Vec::new();
    for f in found {
        if f.group_start {
            out.push("{".to_owned());
        }
        out.push(f.path.first().cloned().unwrap_or_default());
    }
    out
}

/// Every path (segments from the crate root) that the source `src` of the file `rel` (its
/// path beneath the crate's `src`) names through `crate::`, `super::` or `self::`, test code
/// included.
pub fn resolved_paths(rel: &Path, src: &str) -> Vec<Vec<String>> {
    scan(&module_of(rel), &lex(src))
        .into_iter()
        .map(|f| f.path)
        .collect()
}

/// The module a file beneath `src` defines, as segments from the crate root: `a/b.rs` and
/// `a/b/mod.rs` give `["a", "b"]`; the crate roots `lib.rs` and `main.rs` give `[]`.
pub fn module_of(rel: &Path) -> Vec<String> {
    let mut segs: Vec<String> = rel
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .map(|s| s.trim_end_matches(".rs").to_owned())
        .collect();
    if segs.last().is_some_and(|s| s == "mod")
        || (segs.len() == 1 && (segs[0] == "lib" || segs[0] == "main"))
    {
        segs.pop();
    }
    segs
}

/// Every `.rs` file beneath `dir`.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("source dir is readable") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}

/// The top-level module a file of `root` belongs to (`conn/h1.rs` -> `conn`); `lib` and
/// `main` for the crate roots.
pub fn top_module(root: &Path, file: &Path) -> String {
    file.strip_prefix(root)
        .expect("file beneath root")
        .components()
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .unwrap_or("")
        .trim_end_matches(".rs")
        .to_owned()
}

/// The `mod name;` declarations (not inline modules) outside any braces of `toks`.
fn declared_children(toks: &[Tok<'_>]) -> BTreeSet<String> {
    let mut depth = 0usize;
    let mut out = BTreeSet::new();
    for (i, t) in toks.iter().enumerate() {
        match t {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => depth = depth.saturating_sub(1),
            Tok::Ident("mod") if depth == 0 => {
                if let (Some(Tok::Ident(name)), Some(Tok::Punct(';'))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    out.insert((*name).to_owned());
                }
            }
            _ => {}
        }
    }
    out
}

/// The graph of the module files of a crate given as `(path beneath src, source)` pairs.
///
/// A node is a module file; an edge goes from a file to the file that defines the deepest
/// module of a path it names (`crate::runtime::server::ServerError` -> `runtime/server.rs`,
/// `super::pool::Pool` in `proxy/body.rs` -> `proxy/pool.rs`). Left out:
/// - items under `#[cfg(test)]`, files that are `#![cfg(test)]`, and files that their parent
///   declares only under `#[cfg(test)]` (`#[cfg(test)] mod tests;`): a test may reach
///   anywhere;
/// - the crate roots (`lib.rs`, `main.rs`), as nodes and as targets;
/// - an edge from a module to its own parent (the `mod.rs` or `name.rs` that declares it:
///   `use super::X` in a child is how a module is split into files). The parent's imports
///   from its children are edges like any other.
pub fn graph_of(files: &BTreeMap<PathBuf, String>) -> Graph {
    let by_module: BTreeMap<Vec<String>, &Path> =
        files.keys().map(|p| (module_of(p), p.as_path())).collect();
    let name = |p: &Path| -> String {
        p.components()
            .filter_map(|c| c.as_os_str().to_str())
            .collect::<Vec<_>>()
            .join("/")
    };
    let toks: BTreeMap<&Path, Vec<Tok<'_>>> =
        files.iter().map(|(p, s)| (p.as_path(), lex(s))).collect();
    let mut g = Graph::new();
    for (rel, all) in &toks {
        let module = module_of(rel);
        if module.is_empty() {
            continue;
        }
        let parent = &module[..module.len() - 1];
        let code = strip_tests(all);
        if code.is_empty() && !all.is_empty() {
            continue;
        }
        // A file that its parent declares only under `#[cfg(test)]` is test code.
        if let Some(ptoks) = by_module.get(parent).and_then(|p| toks.get(p)) {
            let child = module.last().expect("non-empty");
            if declared_children(ptoks).contains(child)
                && !declared_children(&strip_tests(ptoks)).contains(child)
            {
                continue;
            }
        }
        let me = name(rel);
        let out = g.entry(me.clone()).or_default();
        for f in scan(&module, &code) {
            let path = f.path;
            let target = (0..=path.len())
                .rev()
                .find_map(|k| by_module.get(&path[..k]).map(|p| (k, *p)));
            let Some((k, target)) = target else { continue };
            if k == 0 || path[..k] == *parent {
                continue;
            }
            let t = name(target);
            if t != me {
                out.insert(t);
            }
        }
    }
    g
}

/// The graph of the module files beneath `root` (a crate's `src`): see [`graph_of`].
pub fn graph(root: &Path) -> Graph {
    let files = rust_files(root)
        .into_iter()
        .map(|f| {
            let src = std::fs::read_to_string(&f).expect("readable source");
            (
                f.strip_prefix(root).expect("beneath root").to_path_buf(),
                src,
            )
        })
        .collect();
    graph_of(&files)
}

/// The cycles of `g`: its strongly connected components of more than one module (Tarjan).
pub fn cycles(g: &Graph) -> Vec<Vec<String>> {
    struct Walk<'g> {
        g: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, n: &'g str) {
            let i = self.index.len();
            self.index.insert(n, i);
            self.low.insert(n, i);
            self.stack.push(n);
            self.on_stack.insert(n);
            for w in self.g.get(n).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let ln = self.low[n];
                    self.low.insert(n, ln.min(lw));
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let ln = self.low[n];
                    self.low.insert(n, ln.min(iw));
                }
            }
            if self.low[n] == self.index[n] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    comp.push(w.to_owned());
                    if w == n {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut walk = Walk {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for n in g.keys() {
        if !walk.index.contains_key(n.as_str()) {
            walk.visit(n);
        }
    }
    walk.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> BTreeMap<PathBuf, String> {
        files
            .iter()
            .map(|(p, s)| (PathBuf::from(p), (*s).to_owned()))
            .collect()
    }

    fn paths(rel: &str, src: &str) -> Vec<String> {
        resolved_paths(Path::new(rel), src)
            .into_iter()
            .map(|p| p.join("::"))
            .collect()
    }

    fn edges(g: &Graph, from: &str) -> Vec<String> {
        g.get(from).into_iter().flatten().cloned().collect()
    }

    #[test]
    fn a_cycle_is_found_and_a_chain_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, text).expect("write");
        };
        w("lib.rs", "pub mod a; pub mod b; pub mod c; pub mod d;\n");
        w(
            "a.rs",
            "use crate::b::inner::X; // crate::d in a comment is no import\n",
        );
        w("b/mod.rs", "pub mod inner;\n");
        w("b/inner.rs", "use crate::c::Y;\n");
        w(
            "c.rs",
            "pub fn f() { crate::a::g() }\n#[cfg(test)]\nmod t { use crate::d::Z; }\n",
        );
        w("d.rs", "use crate::a::Q;\n");
        let g = graph(dir.path());
        assert_eq!(cycles(&g), vec![vec!["a.rs", "b/inner.rs", "c.rs"]]);
        w("c.rs", "pub fn f() {}\n");
        assert!(cycles(&graph(dir.path())).is_empty());
    }

    #[test]
    fn super_and_self_resolve_against_the_files_module() {
        assert_eq!(
            paths(
                "proxy/body.rs",
                "use super::pool::Pool;\nfn f() { self::g(); super::super::http::x(); }\n"
            ),
            ["proxy::pool::Pool", "proxy::body::g", "http::x"]
        );
        assert_eq!(
            paths("proxy/mod.rs", "use self::pool::Pool; use super::conn::C;"),
            ["proxy::pool::Pool", "conn::C"]
        );
        assert_eq!(paths("lib.rs", "use self::a::B;"), ["a::B"]);
        assert_eq!(
            paths("a/b/c.rs", "use super::super::super::top::T;"),
            ["top::T"],
            "three supers climb from a::b::c to the root"
        );
    }

    #[test]
    fn use_groups_nest_and_rename() {
        assert_eq!(
            paths(
                "runtime/server.rs",
                "use super::{acme::{self, Order as O}, tls_session::*, upgrade};\n\
                 pub(crate) use crate::{http::body, observe::metrics::M};"
            ),
            [
                "runtime::acme",
                "runtime::acme::Order",
                "runtime::tls_session",
                "runtime::upgrade",
                "http::body",
                "observe::metrics::M",
            ]
        );
    }

    #[test]
    fn comments_strings_visibility_and_inline_modules() {
        let src = r##"
            // use super::commented::X;
            /* crate::block /* nested */ crate::still_comment */
            const S: &str = "super::in_string";
            const R: &str = r#"crate::in_raw " string"#;
            const C: char = '"'; const L: &'static str = "";
            pub(super) fn v() {}
            pub(in crate::a) fn w() {}
            fn s(&self) { self.x(); Self::y(); }
            mod inner {
                use super::Sibling;
                mod deeper { use super::super::Up; }
                use self::deeper::D;
            }
            use super::after::A;
        "##;
        assert_eq!(
            paths("a/b.rs", src),
            [
                "a::b::Sibling",
                "a::b::Up",
                "a::b::inner::deeper::D",
                "a::after::A"
            ]
        );
    }

    #[test]
    fn imports_keeps_crate_paths_and_marks_groups() {
        assert_eq!(
            imports("use crate::a::X; use super::b::Y; use crate::{c, d::E};\n// crate::z\n"),
            ["a", "{", "c", "d"]
        );
        assert_eq!(
            top_imports(
                Path::new("conn/h1.rs"),
                "use super::super::runtime::X; use super::idle::I;"
            ),
            ["runtime", "conn"]
        );
    }

    #[test]
    fn the_graph_is_file_level_with_supers() {
        let g = graph_of(&tree(&[
            ("lib.rs", "mod proxy; pub use proxy::Pool;"),
            (
                "proxy/mod.rs",
                "mod body; mod pool; #[cfg(test)] mod tests;\npub use self::pool::Pool;\n",
            ),
            (
                "proxy/body.rs",
                "use super::{pool::Pool, Shared};\nuse crate::Config;\n",
            ),
            (
                "proxy/pool.rs",
                "use super::body::Body;\nuse super::super::proxy::Shared;",
            ),
            (
                "proxy/tests.rs",
                "use super::body::Body; use crate::proxy::pool::Pool;",
            ),
        ]));
        assert_eq!(
            edges(&g, "proxy/body.rs"),
            ["proxy/pool.rs"],
            "parent and root left out"
        );
        assert_eq!(edges(&g, "proxy/pool.rs"), ["proxy/body.rs"]);
        assert_eq!(
            edges(&g, "proxy/mod.rs"),
            ["proxy/pool.rs"],
            "a parent's use of a child counts"
        );
        assert!(
            !g.contains_key("proxy/tests.rs"),
            "a test-only file is no node"
        );
        assert!(!g.contains_key("lib.rs"));
        assert_eq!(cycles(&g), vec![vec!["proxy/body.rs", "proxy/pool.rs"]]);
    }

    #[test]
    fn test_code_is_left_out_wherever_it_is() {
        let g = graph_of(&tree(&[
            ("lib.rs", "mod a; mod b; mod c;"),
            (
                "a.rs",
                "#[cfg(test)]\nuse crate::b::T;\n#[cfg(test)]\nfn helper() { crate::b::f(); }\n\
                 #[cfg(test)]\nmod t { use crate::b::U; }\nuse crate::c::C;\n#[cfg(test)]\nmod tests;\n",
            ),
            ("a/tests.rs", "use crate::b::V;"),
            ("b.rs", "#![cfg(test)]\nuse crate::a::A;"),
            ("c.rs", "pub struct C;"),
        ]));
        assert_eq!(edges(&g, "a.rs"), ["c.rs"], "{g:?}");
        assert!(
            !g.contains_key("a/tests.rs") && !g.contains_key("b.rs"),
            "{g:?}"
        );
    }

    #[test]
    fn a_module_and_its_parent_are_no_cycle_but_a_grandparent_is() {
        let g = graph_of(&tree(&[
            ("lib.rs", "mod a;"),
            ("a.rs", "mod b; pub use self::b::B; pub struct S;"),
            ("a/b.rs", "mod c; use super::S; pub use self::c::C;"),
            ("a/b/c.rs", "use super::B;"),
        ]));
        assert!(cycles(&g).is_empty(), "{g:?}");
        let g = graph_of(&tree(&[
            ("lib.rs", "mod a;"),
            ("a.rs", "mod b; pub use self::b::c::C;"),
            ("a/b.rs", "pub mod c;"),
            ("a/b/c.rs", "use super::super::S;"),
        ]));
        assert_eq!(cycles(&g), vec![vec!["a.rs", "a/b/c.rs"]]);
    }
}
