//! Environment variables in string values: `${VAR}`, `${VAR:-default}`, and `$${` for a
//! literal `${`.
//!
//! Substitution happens after the file is parsed, inside string values only: a variable's
//! value is never read as TOML, so it cannot add keys, tables or quotes, whatever it holds.
//! The value is not scanned again (a `${` inside it stays as it is).

/// Looks a variable up: `Ok(None)` when it is not set, `Err` when it is set but unusable.
pub(crate) type Lookup<'a> = &'a dyn Fn(&str) -> Result<Option<String>, String>;

/// The process environment.
pub(crate) fn process_env(name: &str) -> Result<Option<String>, String> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(format!("environment variable `{name}` is not valid UTF-8"))
        }
    }
}

/// A string with its references replaced.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Expanded {
    pub value: String,
    /// The variable, when the whole string was one reference (`"${PORT}"`).
    pub whole: Option<String>,
}

/// A reference that cannot be expanded: `at` is the byte index of its `${` in the string,
/// `name` the variable (empty when the reference is malformed).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct EnvError {
    pub at: usize,
    pub name: String,
    pub message: String,
}

const ESCAPE_HINT: &str = "write `$${` for a literal `${`";

/// Expands the references in `s`; `None` when it holds none (the common case: no copy).
pub(crate) fn expand(s: &str, env: Lookup) -> Result<Option<Expanded>, EnvError> {
    if !s.contains("${") {
        return Ok(None);
    }
    let mut out = String::with_capacity(s.len());
    let mut whole = None;
    let mut i = 0;
    while let Some(rel) = s[i..].find('$') {
        let d = i + rel;
        out.push_str(&s[i..d]);
        let rest = &s[d..];
        if rest.starts_with("$${") {
            out.push_str("${");
            i = d + 3;
        } else if rest.starts_with("${") {
            let Some(close) = rest.find('}') else {
                return Err(EnvError {
                    at: d,
                    name: String::new(),
                    message: format!("`${{` without its closing `}}` ({ESCAPE_HINT})"),
                });
            };
            let inner = &rest[2..close];
            let (name, default) = match inner.split_once(":-") {
                Some((n, dflt)) => (n, Some(dflt)),
                None => (inner, None),
            };
            let err = |message: String| EnvError {
                at: d,
                name: name.to_owned(),
                message,
            };
            if !valid_name(name) {
                return Err(err(format!(
                    "`${{{inner}}}` is not a variable reference (a name is letters, digits and `_`, \
                     not starting with a digit; {ESCAPE_HINT}, e.g. for a `rewrite` capture)"
                )));
            }
            let value = env(name).map_err(&err)?;
            match (value, default) {
                (Some(v), Some(dflt)) if v.is_empty() => out.push_str(dflt),
                (Some(v), _) => out.push_str(&v),
                (None, Some(dflt)) => out.push_str(dflt),
                (None, None) => {
                    return Err(err(format!(
                        "environment variable `{name}` is not set (give a default with \
                         `${{{name}:-default}}`; {ESCAPE_HINT})"
                    )))
                }
            }
            if d == 0 && close + 1 == s.len() {
                whole = Some(name.to_owned());
            }
            i = d + close + 1;
        } else {
            out.push('$');
            i = d + 1;
        }
    }
    out.push_str(&s[i..]);
    Ok(Some(Expanded { value: out, whole }))
}

fn valid_name(n: &str) -> bool {
    let mut c = n.chars();
    matches!(c.next(), Some(f) if f == '_' || f.is_ascii_alphabetic())
        && c.all(|ch| ch == '_' || ch.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Result<Option<String>, String> {
        Ok(match name {
            "PORT" => Some("8443".into()),
            "EMPTY" => Some(String::new()),
            "EVIL" => Some("x\"\n[admin]\naddress = \"0.0.0.0:1\"\n${PORT}".into()),
            _ => None,
        })
    }

    fn ok(s: &str) -> String {
        expand(s, &env)
            .unwrap()
            .map(|e| e.value)
            .unwrap_or(s.into())
    }

    fn fail(s: &str) -> EnvError {
        expand(s, &env).unwrap_err()
    }

    #[test]
    fn references_defaults_and_escapes() {
        assert_eq!(ok("127.0.0.1:${PORT}"), "127.0.0.1:8443");
        assert_eq!(ok("${NOPE:-8080}"), "8080");
        assert_eq!(ok("${EMPTY:-d}"), "d");
        assert_eq!(ok("${EMPTY}"), "");
        assert_eq!(ok("${PORT:-1}"), "8443");
        assert_eq!(ok("$${PORT}"), "${PORT}");
        assert_eq!(ok("$$${PORT}"), "$${PORT}");
        assert_eq!(ok("cost: $5, ^a$"), "cost: $5, ^a$");
        assert_eq!(ok("$"), "$");
        assert_eq!(ok("${NOPE:-a:-b}"), "a:-b");
        assert_eq!(
            expand("${PORT}", &env).unwrap().unwrap().whole.as_deref(),
            Some("PORT")
        );
        assert_eq!(expand(":${PORT}", &env).unwrap().unwrap().whole, None);
    }

    #[test]
    fn a_value_is_text_never_syntax() {
        // quotes, newlines, table headers and references inside a value stay literal
        assert_eq!(
            ok("${EVIL}"),
            "x\"\n[admin]\naddress = \"0.0.0.0:1\"\n${PORT}"
        );
    }

    #[test]
    fn errors_say_where_and_why() {
        let e = fail("a ${NOPE} b");
        assert_eq!((e.at, e.name.as_str()), (2, "NOPE"));
        assert!(e.message.contains("`NOPE` is not set"), "{}", e.message);
        let e = fail("/x/${rest}");
        assert_eq!(e.at, 3);
        let e = fail("${1}");
        assert!(
            e.message.contains("not a variable reference"),
            "{}",
            e.message
        );
        assert!(fail("${PORT").message.contains("closing"));
        assert!(fail("${}").message.contains("not a variable reference"));
        assert!(fail("${A B}").message.contains("not a variable reference"));
    }
}
