//! The import graph of a crate's top-level modules, read from its sources: `crate::name`
//! paths outside comments. rustc cannot forbid an import inside one crate, so the workspace's
//! shape (qweb-server's layers, no cycle between modules in any crate) is checked by tests
//! that read this graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module name to the top-level modules it imports (itself left out).
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The `crate::name` paths in `src`, in order, `//` comments left out. `crate::{` gives the
/// entry `"{"`, so that a caller can insist on one path per layer.
pub fn imports(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in src.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            if rest.starts_with('{') {
                out.push("{".to_owned());
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
        }
    }
    out
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

/// The graph of `root`'s top-level modules. Code from the first `#[cfg(test)]` of a file on
/// is left out (a test may reach anywhere), as are the crate roots.
pub fn graph(root: &Path) -> Graph {
    let mut g = Graph::new();
    for file in rust_files(root) {
        let top = top_module(root, &file);
        if top == "lib" || top == "main" {
            continue;
        }
        let src = std::fs::read_to_string(&file).expect("readable source");
        let code = src.split("#[cfg(test)]").next().unwrap_or("");
        let out = g.entry(top.clone()).or_default();
        for name in imports(code) {
            if name != top && name != "{" {
                out.insert(name);
            }
        }
    }
    g
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
            "use crate::b::X; // crate::d in a comment is no import\n",
        );
        w("b/mod.rs", "mod inner;\n");
        w("b/inner.rs", "use crate::c::Y;\n");
        w(
            "c.rs",
            "pub fn f() { crate::a::g() }\n#[cfg(test)]\nmod t { use crate::d::Z; }\n",
        );
        w("d.rs", "use crate::a::Q;\n");
        let g = graph(dir.path());
        assert_eq!(cycles(&g), vec![vec!["a", "b", "c"]]);
        w("c.rs", "pub fn f() {}\n");
        assert!(cycles(&graph(dir.path())).is_empty());
    }
}
