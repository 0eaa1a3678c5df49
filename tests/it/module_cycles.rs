//! No crate of the workspace has an import cycle between its module files (`crate::`,
//! `super::` and `self::` paths; a child's imports from its own parent aside): read from the
//! sources, since rustc allows any import inside a crate. qweb-server's stricter check
//! (imports only go down its layers) is its own unit test.

use std::path::Path;

use qweb_testkit::modgraph::{cycles, graph};

#[test]
fn no_crate_has_a_module_cycle() {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut roots = vec![ws.join("src")];
    for e in std::fs::read_dir(ws.join("crates")).expect("crates/ is readable") {
        roots.push(e.expect("dir entry").path().join("src"));
    }
    let mut found = Vec::new();
    for root in &roots {
        for c in cycles(&graph(root)) {
            found.push(format!("{}: {}", root.display(), c.join(" <-> ")));
        }
    }
    assert!(roots.len() >= 7, "the crates were found: {roots:?}");
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}
