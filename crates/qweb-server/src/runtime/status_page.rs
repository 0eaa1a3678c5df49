//! `/status`: the HTML status page, one self-contained document (inline style and script, no
//! external asset) that refreshes itself from `/status.json` every second. Its
//! Content-Security-Policy allows exactly its own style and script, by their SHA-256, and
//! nothing else but fetching from this origin; the script writes every value with
//! `textContent`, so names from the configuration cannot inject markup.

use std::sync::LazyLock;

const HTML: &str = include_str!("status_page/page.html");
const STYLE: &str = include_str!("status_page/page.css");
const SCRIPT: &str = include_str!("status_page/page.js");

/// The page and its `Content-Security-Policy`, built once.
pub(crate) struct Page {
    pub html: String,
    pub csp: String,
}

/// A CSP source for inline content: `'sha256-…'`.
fn hash_source(content: &str) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, content.as_bytes());
    format!("'sha256-{}'", qweb_http::base64(digest.as_ref()))
}

/// The status page.
pub(crate) static PAGE: LazyLock<Page> = LazyLock::new(|| Page {
    html: HTML
        .replacen("/*STYLE*/", STYLE, 1)
        .replacen("/*SCRIPT*/", SCRIPT, 1),
    csp: format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src data:; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hash_source(SCRIPT),
        hash_source(STYLE)
    ),
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_holds_its_style_and_script_once_and_the_policy_names_them() {
        let p = &*PAGE;
        assert_eq!(p.html.matches("<script>").count(), 1);
        assert!(p.html.contains(&format!("<script>{SCRIPT}</script>")));
        assert!(p.html.contains(&format!("<style>{STYLE}</style>")));
        assert!(!p.html.contains("/*SCRIPT*/") && !p.html.contains("/*STYLE*/"));
        // nothing in them could end their element early
        assert!(!SCRIPT.contains("</") && !STYLE.contains("</"));
        // no markup from data: the script never parses strings as HTML
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!SCRIPT.contains(sink), "{sink}");
        }
        assert!(p.csp.starts_with("default-src 'none'; script-src 'sha256-"));
        assert!(!p.csp.contains("unsafe"));
        // a known digest: SHA-256 of "" in base64
        assert_eq!(
            hash_source(""),
            "'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='"
        );
    }
}
