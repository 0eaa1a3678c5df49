//! No source file over 800 lines and no function over 150 (issue 36), test code aside.
//!
//! Every `.rs` file under `src/` and `crates/*/src/` is parsed with `syn` (line numbers from
//! proc-macro2's `span-locations`), so braces in strings, chars and comments cannot miscount.
//! - A file's size is its lines outside `#[cfg(test)]` items (a test module that pushes a file
//!   over is fine). A file that is itself test-only (declared `#[cfg(test)] mod x;` in its
//!   parent, or below such a module) is exempt.
//! - A function's size runs from its `fn` line to its closing brace; functions inside
//!   `#[cfg(test)]` items and `#[test]` functions are exempt. Free functions, methods and
//!   trait methods with a default body count; closures and code inside macro calls do not.
//!
//! `vendor/`, `tests/`, `benches/`, `examples/` and `fuzz/` are not under a `src/` scanned.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::{self, Visit};

/// The most lines a source file may have outside its test code.
const MAX_FILE_LINES: usize = 800;
/// The most lines a function may have, `fn` line to closing brace.
const MAX_FN_LINES: usize = 150;

/// Violations that are being fixed (issue 36): `path` for a file over the limit,
/// `path::fn` (`path::Type::fn` for a method) for a function. The test fails on a violation
/// not listed here, and on an entry here that no longer violates (remove it then). Empty
/// now: the last one, `crates/qweb-http/src/h1/fuzzing.rs::head` (157 lines), was split.
const KNOWN: &[(&str, &str)] = &[];

#[test]
fn no_file_over_800_lines_and_no_fn_over_150() {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tree = scan_tree(ws).unwrap_or_else(|e| panic!("scanning the sources: {e}"));
    assert!(
        tree.files > 100 && tree.roots >= 7,
        "the sources were found: {} files in {} src/ folders",
        tree.files,
        tree.roots
    );
    let known: BTreeMap<&str, &str> = KNOWN.iter().copied().collect();
    assert_eq!(known.len(), KNOWN.len(), "KNOWN lists an entry twice");
    let mut new = Vec::new();
    for v in &tree.violations {
        let tag = match known.get(v.key.as_str()) {
            Some(reason) => format!("known ({reason})"),
            None => {
                new.push(v.to_string());
                "NEW".to_string()
            }
        };
        println!("{v} [{tag}]");
    }
    let found: BTreeSet<&str> = tree.violations.iter().map(|v| v.key.as_str()).collect();
    let fixed: Vec<String> = KNOWN
        .iter()
        .filter(|(k, _)| !found.contains(k))
        .map(|(k, _)| format!("{k} is within the limits now: remove it from KNOWN"))
        .collect();
    println!(
        "{} files scanned ({} test-only), {} violations, {} known",
        tree.files,
        tree.test_only,
        tree.violations.len(),
        KNOWN.len()
    );
    assert!(
        new.is_empty() && fixed.is_empty(),
        "files over {MAX_FILE_LINES} lines or functions over {MAX_FN_LINES} \
         (outside test code):\n{}\n{}",
        new.join("\n"),
        fixed.join("\n")
    );
}

/// One file or function over its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Violation {
    /// `path` or `path::fn`, as in [`KNOWN`].
    key: String,
    /// The file, relative to the workspace.
    file: String,
    /// The file's first line, or the function's `fn` line.
    line: usize,
    /// Lines counted.
    lines: usize,
    /// The function, `None` for the file.
    func: Option<String>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.func {
            Some(name) => write!(
                f,
                "{}:{}: fn {name} is {} lines (limit {MAX_FN_LINES})",
                self.file, self.line, self.lines
            ),
            None => write!(
                f,
                "{}:{}: {} lines outside test code (limit {MAX_FILE_LINES})",
                self.file, self.line, self.lines
            ),
        }
    }
}

/// A function's size.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FnSize {
    /// `name`, `Type::name` in an impl or trait, `outer::name` nested in a function.
    name: String,
    /// The `fn` keyword's line.
    line: usize,
    lines: usize,
}

/// An out-of-line `mod name;`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ModDecl {
    /// The inline modules it is declared in, outermost first.
    inline: Vec<String>,
    name: String,
    /// Its `#[path = "..."]`.
    path: Option<String>,
    /// Declared `#[cfg(test)]` or inside test code.
    test: bool,
}

/// What the checks need from one source file.
#[derive(Debug, Default)]
struct Scanned {
    /// All its lines.
    lines: usize,
    /// Lines of `#[cfg(test)]` items (attributes and doc comments included).
    test_lines: usize,
    /// Functions outside test code.
    fns: Vec<FnSize>,
    mods: Vec<ModDecl>,
}

/// Parses one source file.
fn scan_source(src: &str) -> syn::Result<Scanned> {
    let file = syn::parse_file(src)?;
    let lines = src.lines().count();
    let mut v = Scanner {
        in_test: false,
        names: Vec::new(),
        inline: Vec::new(),
        test_line: vec![false; lines + 2],
        fns: Vec::new(),
        mods: Vec::new(),
    };
    v.visit_file(&file);
    Ok(Scanned {
        lines,
        test_lines: v.test_line.iter().filter(|t| **t).count(),
        fns: v.fns,
        mods: v.mods,
    })
}

struct Scanner {
    /// Inside a `#[cfg(test)]` item.
    in_test: bool,
    /// Impl/trait types and functions around the current point.
    names: Vec<String>,
    /// Inline modules around the current point.
    inline: Vec<String>,
    /// Per line (1-based): inside a `#[cfg(test)]` item.
    test_line: Vec<bool>,
    fns: Vec<FnSize>,
    mods: Vec<ModDecl>,
}

impl Scanner {
    /// Visits `node` as test code when `attrs` say so, marking its lines.
    fn maybe_test(
        &mut self,
        attrs: &[syn::Attribute],
        span: proc_macro2::Span,
        go: impl FnOnce(&mut Self),
    ) {
        if self.in_test || !attrs.iter().any(is_cfg_test) {
            return go(self);
        }
        let (a, b) = (span.start().line, span.end().line);
        for l in a..=b.min(self.test_line.len() - 1) {
            self.test_line[l] = true;
        }
        self.in_test = true;
        go(self);
        self.in_test = false;
    }

    /// Records a function (outside test code, not a `#[test]`) and visits its body.
    fn func(
        &mut self,
        attrs: &[syn::Attribute],
        sig: &syn::Signature,
        block: &syn::Block,
        go: impl FnOnce(&mut Self),
    ) {
        let name = sig.ident.to_string();
        if !self.in_test && !attrs.iter().any(is_test_fn) {
            let line = sig.fn_token.span.start().line;
            let end = block.brace_token.span.close().end().line;
            let mut full = self.names.clone();
            full.push(name.clone());
            self.fns.push(FnSize {
                name: full.join("::"),
                line,
                lines: end + 1 - line,
            });
        }
        self.names.push(name);
        go(self);
        self.names.pop();
    }
}

impl<'ast> Visit<'ast> for Scanner {
    fn visit_item(&mut self, i: &'ast syn::Item) {
        self.maybe_test(item_attrs(i), i.span(), |s| visit::visit_item(s, i));
    }

    fn visit_impl_item(&mut self, i: &'ast syn::ImplItem) {
        let attrs: &[syn::Attribute] = match i {
            syn::ImplItem::Const(x) => &x.attrs,
            syn::ImplItem::Fn(x) => &x.attrs,
            syn::ImplItem::Type(x) => &x.attrs,
            syn::ImplItem::Macro(x) => &x.attrs,
            _ => &[],
        };
        self.maybe_test(attrs, i.span(), |s| visit::visit_impl_item(s, i));
    }

    fn visit_trait_item(&mut self, i: &'ast syn::TraitItem) {
        let attrs: &[syn::Attribute] = match i {
            syn::TraitItem::Const(x) => &x.attrs,
            syn::TraitItem::Fn(x) => &x.attrs,
            syn::TraitItem::Type(x) => &x.attrs,
            syn::TraitItem::Macro(x) => &x.attrs,
            _ => &[],
        };
        self.maybe_test(attrs, i.span(), |s| visit::visit_trait_item(s, i));
    }

    fn visit_item_mod(&mut self, i: &'ast syn::ItemMod) {
        let name = i.ident.to_string();
        if i.content.is_none() {
            self.mods.push(ModDecl {
                inline: self.inline.clone(),
                name,
                path: i.attrs.iter().find_map(path_attr),
                test: self.in_test,
            });
            return;
        }
        self.inline.push(name);
        let names = std::mem::take(&mut self.names);
        visit::visit_item_mod(self, i);
        self.names = names;
        self.inline.pop();
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        self.names.push(type_name(&i.self_ty));
        visit::visit_item_impl(self, i);
        self.names.pop();
    }

    fn visit_item_trait(&mut self, i: &'ast syn::ItemTrait) {
        self.names.push(i.ident.to_string());
        visit::visit_item_trait(self, i);
        self.names.pop();
    }

    fn visit_item_fn(&mut self, i: &'ast syn::ItemFn) {
        self.func(&i.attrs, &i.sig, &i.block, |s| visit::visit_item_fn(s, i));
    }

    fn visit_impl_item_fn(&mut self, i: &'ast syn::ImplItemFn) {
        self.func(&i.attrs, &i.sig, &i.block, |s| {
            visit::visit_impl_item_fn(s, i)
        });
    }

    fn visit_trait_item_fn(&mut self, i: &'ast syn::TraitItemFn) {
        match &i.default {
            Some(block) => self.func(&i.attrs, &i.sig, block, |s| {
                visit::visit_trait_item_fn(s, i)
            }),
            None => visit::visit_trait_item_fn(self, i),
        }
    }
}

/// An item's outer attributes.
fn item_attrs(i: &syn::Item) -> &[syn::Attribute] {
    use syn::Item::*;
    match i {
        Const(x) => &x.attrs,
        Enum(x) => &x.attrs,
        ExternCrate(x) => &x.attrs,
        Fn(x) => &x.attrs,
        ForeignMod(x) => &x.attrs,
        Impl(x) => &x.attrs,
        Macro(x) => &x.attrs,
        Mod(x) => &x.attrs,
        Static(x) => &x.attrs,
        Struct(x) => &x.attrs,
        Trait(x) => &x.attrs,
        TraitAlias(x) => &x.attrs,
        Type(x) => &x.attrs,
        Union(x) => &x.attrs,
        Use(x) => &x.attrs,
        _ => &[],
    }
}

/// `#[cfg(test)]`, or a `cfg` that needs `test` (`all(test, ..)`): any `cfg` naming `test`
/// without a `not(..)`.
fn is_cfg_test(a: &syn::Attribute) -> bool {
    if !a.path().is_ident("cfg") {
        return false;
    }
    let Ok(list) = a.meta.require_list() else {
        return false;
    };
    let words = list.tokens.to_string();
    let idents: Vec<&str> = words
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .collect();
    idents.contains(&"test") && !idents.contains(&"not") && !idents.contains(&"any")
}

/// `#[test]`, `#[tokio::test]` and the like.
fn is_test_fn(a: &syn::Attribute) -> bool {
    a.path().segments.last().is_some_and(|s| s.ident == "test")
}

/// A `#[path = "..."]` attribute's value.
fn path_attr(a: &syn::Attribute) -> Option<String> {
    let syn::Meta::NameValue(nv) = &a.meta else {
        return None;
    };
    if !nv.path.is_ident("path") {
        return None;
    }
    match &nv.value {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(s),
            ..
        }) => Some(s.value()),
        _ => None,
    }
}

/// An impl's type, by the last segment of its path (`Foo` for `a::Foo<T>`, `&Foo`).
fn type_name(t: &syn::Type) -> String {
    match t {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default(),
        syn::Type::Reference(r) => type_name(&r.elem),
        syn::Type::Paren(p) => type_name(&p.elem),
        other => other.span().start().line.to_string(),
    }
}

/// The violations of one non-test-only file, `rel` its path relative to the workspace.
fn violations(rel: &str, s: &Scanned) -> Vec<Violation> {
    let mut out = Vec::new();
    let lines = s.lines - s.test_lines;
    if lines > MAX_FILE_LINES {
        out.push(Violation {
            key: rel.to_string(),
            file: rel.to_string(),
            line: 1,
            lines,
            func: None,
        });
    }
    for f in s.fns.iter().filter(|f| f.lines > MAX_FN_LINES) {
        out.push(Violation {
            key: format!("{rel}::{}", f.name),
            file: rel.to_string(),
            line: f.line,
            lines: f.lines,
            func: Some(f.name.clone()),
        });
    }
    out
}

/// The files a `mod` declaration of `file` may be (the first that exists is it).
fn mod_candidates(file: &Path, is_root: bool, m: &ModDecl) -> Vec<PathBuf> {
    let parent = file.parent().unwrap_or(Path::new(""));
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    // lib.rs, main.rs, bin/*.rs and mod.rs keep their modules beside them; a.rs in a/
    let mut dir = if is_root || stem == "mod" {
        parent.to_path_buf()
    } else {
        parent.join(stem)
    };
    if let Some(p) = &m.path {
        if m.inline.is_empty() {
            return vec![parent.join(p)];
        }
        dir.extend(&m.inline);
        return vec![dir.join(p)];
    }
    dir.extend(&m.inline);
    vec![
        dir.join(format!("{}.rs", m.name)),
        dir.join(&m.name).join("mod.rs"),
    ]
}

/// The scan of a workspace.
#[derive(Debug, Default)]
struct Tree {
    /// `src/` folders scanned.
    roots: usize,
    /// `.rs` files read.
    files: usize,
    /// Of them, test-only modules (exempt).
    test_only: usize,
    violations: Vec<Violation>,
}

/// Scans `ws/src` and `ws/crates/*/src`.
fn scan_tree(ws: &Path) -> Result<Tree, String> {
    let mut roots = vec![ws.join("src")];
    if let Ok(rd) = std::fs::read_dir(ws.join("crates")) {
        for e in rd {
            let e = e.map_err(|e| e.to_string())?;
            roots.push(e.path().join("src"));
        }
    }
    roots.retain(|r| r.is_dir());
    roots.sort();
    let mut scanned = BTreeMap::new();
    for root in &roots {
        let mut files = Vec::new();
        rs_files(root, &mut files).map_err(|e| format!("{}: {e}", root.display()))?;
        for f in files {
            let src = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
            let s = scan_source(&src).map_err(|e| {
                let at = e.span().start();
                format!("{}:{}:{}: {e}", f.display(), at.line, at.column + 1)
            })?;
            let parent = f.parent().unwrap_or(root);
            let is_root = parent == root
                && matches!(
                    f.file_name().and_then(|n| n.to_str()),
                    Some("lib.rs" | "main.rs")
                )
                || parent == root.join("bin");
            scanned.insert(f, (is_root, s));
        }
    }
    // Test-only files: declared under #[cfg(test)], and every module below one.
    let mut test_only = BTreeSet::new();
    let mut todo: Vec<PathBuf> = Vec::new();
    let resolve = |file: &Path, is_root: bool, m: &ModDecl| {
        mod_candidates(file, is_root, m)
            .into_iter()
            .find(|c| c.is_file())
    };
    for (f, (is_root, s)) in &scanned {
        todo.extend(
            s.mods
                .iter()
                .filter(|m| m.test)
                .filter_map(|m| resolve(f, *is_root, m)),
        );
    }
    while let Some(f) = todo.pop() {
        if !test_only.insert(f.clone()) {
            continue;
        }
        if let Some((is_root, s)) = scanned.get(&f) {
            todo.extend(s.mods.iter().filter_map(|m| resolve(&f, *is_root, m)));
        }
    }
    let mut tree = Tree {
        roots: roots.len(),
        files: scanned.len(),
        test_only: test_only.len(),
        violations: Vec::new(),
    };
    for (f, (_, s)) in &scanned {
        if test_only.contains(f) {
            continue;
        }
        let rel = f.strip_prefix(ws).unwrap_or(f);
        let rel = rel.to_string_lossy().replace('\\', "/");
        tree.violations.extend(violations(&rel, s));
    }
    Ok(tree)
}

/// Every `.rs` file under `dir`, recursively.
fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            rs_files(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    Ok(())
}

mod scanner_tests {
    use super::*;

    /// A function of exactly `n` lines, `fn` line to closing brace.
    fn func(name: &str, n: usize) -> String {
        let mut s = format!("fn {name}() {{\n");
        for i in 0..n - 2 {
            s.push_str(&format!("    let _x{i} = 1;\n"));
        }
        s.push_str("}\n");
        s
    }

    fn sizes(src: &str) -> Vec<(String, usize, usize)> {
        let s = scan_source(src).expect("parses");
        s.fns
            .into_iter()
            .map(|f| (f.name, f.line, f.lines))
            .collect()
    }

    #[test]
    fn a_151_line_fn_is_caught_150_passes() {
        let src = format!("//! doc\n\n{}\n{}", func("ok", 150), func("long", 151));
        let s = scan_source(&src).expect("parses");
        assert_eq!(
            sizes(&src),
            [("ok".into(), 3, 150), ("long".into(), 154, 151)]
        );
        let v = violations("x.rs", &s);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].key, "x.rs::long");
        assert_eq!(
            v[0].to_string(),
            "x.rs:154: fn long is 151 lines (limit 150)"
        );
    }

    #[test]
    fn size_runs_from_the_fn_line_not_the_doc_comment() {
        let src = "/// one\n/// two\n#[inline]\npub(crate) async fn f(\n    a: u8,\n) -> u8 {\n    a\n}\n";
        assert_eq!(sizes(src), [("f".into(), 4, 5)]);
    }

    #[test]
    fn braces_in_strings_chars_and_comments_do_not_count() {
        let src = concat!(
            "fn f() {\n",
            "    let _ = \"}}}\"; // }\n",
            "    let _ = '}';\n",
            "    /* } { */\n",
            "    let _ = r#\"}\"#;\n",
            "    let _: &'static str = \"{\";\n",
            "}\n",
            "fn g() {}\n",
        );
        assert_eq!(sizes(src), [("f".into(), 1, 7), ("g".into(), 8, 1)]);
    }

    #[test]
    fn methods_and_nested_fns_are_named_by_their_type_and_fn() {
        let src = concat!(
            "struct S;\n",
            "impl<T> Tr for a::S<T> { fn m(&self) { fn inner() {} } }\n",
            "trait Tr { fn m(&self) {} fn decl(&self); }\n",
            "mod inl { fn free() {} }\n",
        );
        let names: Vec<String> = sizes(src).into_iter().map(|f| f.0).collect();
        assert_eq!(names, ["S::m", "S::m::inner", "Tr::m", "free"]);
    }

    #[test]
    fn test_modules_and_test_fns_are_exempt() {
        let src = format!(
            "fn a() {{}}\n\n/// tests\n#[cfg(test)]\nmod tests {{\n{}}}\n#[test]\n{}\n#[tokio::test]\n{}\n#[cfg(all(test, unix))]\n{}",
            func("in_mod", 200),
            func("t", 200),
            func("tt", 200),
            func("helper", 200),
        );
        let s = scan_source(&src).expect("parses");
        assert_eq!(sizes(&src), [("a".into(), 1, 1)]);
        // the test module's doc comment, attribute, braces and body; the cfg(all(test)) fn
        assert_eq!(s.test_lines, 3 + 200 + 1 + 201);
        assert!(violations("x.rs", &s).is_empty());
    }

    #[test]
    fn cfg_not_test_is_not_test_code() {
        let src = format!("#[cfg(not(test))]\n{}", func("prod", 151));
        let s = scan_source(&src).expect("parses");
        assert_eq!(s.test_lines, 0);
        assert_eq!(violations("x.rs", &s).len(), 1);
    }

    #[test]
    fn file_size_leaves_the_test_module_out() {
        let body: String = (0..MAX_FILE_LINES - 1)
            .map(|i| format!("const C{i}: u8 = 0;\n"))
            .collect();
        let tests = format!("#[cfg(test)]\nmod tests {{\n{}}}\n", func("t", 50));
        let fits = format!("//! doc\n{body}{tests}");
        let s = scan_source(&fits).expect("parses");
        assert_eq!((s.lines, s.test_lines), (MAX_FILE_LINES + 53, 53));
        assert!(violations("x.rs", &s).is_empty());
        let over = format!("//! doc\n//! more\n{body}{tests}");
        let v = violations("x.rs", &scan_source(&over).expect("parses"));
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(
            v[0].to_string(),
            "x.rs:1: 801 lines outside test code (limit 800)"
        );
    }

    #[test]
    fn mod_declarations_are_found_with_their_test_flag() {
        let src = concat!(
            "mod a;\n",
            "#[cfg(test)]\nmod tests;\n",
            "#[cfg(test)]\nmod support { mod fixtures; }\n",
            "mod outer { #[path = \"p.rs\"] mod inner; }\n",
        );
        let mods = scan_source(src).expect("parses").mods;
        let got: Vec<(Vec<String>, &str, Option<&str>, bool)> = mods
            .iter()
            .map(|m| (m.inline.clone(), m.name.as_str(), m.path.as_deref(), m.test))
            .collect();
        assert_eq!(
            got,
            [
                (vec![], "a", None, false),
                (vec![], "tests", None, true),
                (vec!["support".into()], "fixtures", None, true),
                (vec!["outer".into()], "inner", Some("p.rs"), false),
            ]
        );
    }

    #[test]
    fn a_tree_exempts_test_only_files_and_their_children() {
        let ws = tempfile::tempdir().expect("tempdir");
        let src = ws.path().join("crates/c/src");
        std::fs::create_dir_all(src.join("big/tests")).expect("mkdir");
        let huge: String = (0..900).map(|i| format!("const C{i}: u8 = 0;\n")).collect();
        let write = |p: &str, s: &str| std::fs::write(src.join(p), s).expect("write");
        write("lib.rs", "mod big;\nmod long;\n");
        write("big.rs", "#[cfg(test)]\nmod tests;\n");
        write("big/tests/mod.rs", &format!("mod deep;\n{huge}"));
        write("big/tests/deep.rs", &huge);
        write("long.rs", &format!("{}{huge}", func("f", 151)));
        let tree = scan_tree(ws.path()).expect("scans");
        assert_eq!((tree.roots, tree.files, tree.test_only), (1, 5, 2));
        let got: Vec<String> = tree.violations.iter().map(|v| v.to_string()).collect();
        assert_eq!(
            got,
            [
                "crates/c/src/long.rs:1: 1051 lines outside test code (limit 800)",
                "crates/c/src/long.rs:1: fn f is 151 lines (limit 150)",
            ]
        );
    }
}
