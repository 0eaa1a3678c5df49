//! One configuration file as a tree of spanned values, and the merge of an included file's tree
//! into its includer's.
//!
//! The tree is read with the `toml` crate (so syntax errors are its own, with their spans) and
//! keeps the byte span of every key and value. Spans are *global*: each file of a
//! configuration has its own range of offsets ([`super::Sources`]), so an error anywhere names
//! the right file, line and column.

use std::fmt;
use std::ops::Range;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A value and where it is written.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub span: Range<usize>,
    pub kind: Kind,
}

/// The TOML value kinds.
#[derive(Debug, Clone)]
pub(crate) enum Kind {
    /// A string; `var` names the environment variable when the whole string was one
    /// `${VAR}` reference (such a string may stand for a number or a boolean, see
    /// `super::de`).
    Str {
        value: String,
        var: Option<String>,
    },
    Int(i64),
    Float(f64),
    Bool(bool),
    /// Date-times have no meaning in qweb's configuration; kept to refuse them by name.
    Datetime,
    Array(Vec<Node>),
    /// Entries in file order.
    Table(Vec<Entry>),
}

/// A key of a table and its value.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub key: String,
    pub key_span: Range<usize>,
    pub value: Node,
}

impl Node {
    /// Moves every span `by` bytes (from the file's offsets to the configuration's).
    pub fn shift(&mut self, by: usize) {
        self.span = self.span.start + by..self.span.end + by;
        match &mut self.kind {
            Kind::Array(items) => items.iter_mut().for_each(|n| n.shift(by)),
            Kind::Table(entries) => entries.iter_mut().for_each(|e| {
                e.key_span = e.key_span.start + by..e.key_span.end + by;
                e.value.shift(by);
            }),
            _ => {}
        }
    }

    /// The entries when this is a table.
    pub fn entries_mut(&mut self) -> Option<&mut Vec<Entry>> {
        match &mut self.kind {
            Kind::Table(e) => Some(e),
            _ => None,
        }
    }

    /// An array whose items are all tables (`[[route]]`, `key = [{ ... }]`): such arrays
    /// written in several files are concatenated.
    fn is_table_array(&self) -> bool {
        matches!(&self.kind, Kind::Array(items) if items.iter().all(|n| matches!(n.kind, Kind::Table(_))))
    }

    /// A name for the kind, in errors.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            Kind::Str { .. } => "a string",
            Kind::Int(_) => "an integer",
            Kind::Float(_) => "a float",
            Kind::Bool(_) => "a boolean",
            Kind::Datetime => "a date-time",
            Kind::Array(_) => "an array",
            Kind::Table(_) => "a table",
        }
    }
}

/// Why two trees do not merge: `key` (dotted) is set at `first` and again at `second`.
#[derive(Debug)]
pub(crate) struct Conflict {
    pub key: String,
    pub first: Range<usize>,
    pub second: Range<usize>,
}

/// Merges `from` (an included file's table) into `into`: tables merge key by key, arrays of
/// tables are appended, and any other key set on both sides is a [`Conflict`].
pub(crate) fn merge(into: &mut Vec<Entry>, from: Vec<Entry>, path: &str) -> Result<(), Conflict> {
    for e in from {
        let key = if path.is_empty() {
            e.key.clone()
        } else {
            format!("{path}.{}", e.key)
        };
        let Some(have) = into.iter_mut().find(|h| h.key == e.key) else {
            into.push(e);
            continue;
        };
        let appendable = have.value.is_table_array() && e.value.is_table_array();
        match (&mut have.value.kind, e.value.kind) {
            (Kind::Table(a), Kind::Table(b)) => merge(a, b, &key)?,
            (Kind::Array(a), Kind::Array(b)) if appendable => a.extend(b),
            _ => {
                return Err(Conflict {
                    key,
                    first: have.key_span.clone(),
                    second: e.key_span,
                })
            }
        }
    }
    Ok(())
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde_spanned::__unstable as sp;
        static FIELDS: [&str; 3] = [sp::START_FIELD, sp::END_FIELD, sp::VALUE_FIELD];
        d.deserialize_struct(sp::NAME, &FIELDS, NodeVisitor)
    }
}

/// A value as toml gives it: through `Spanned`'s protocol (start, end, value) where it knows
/// the span, else plainly (an implicit table, `a` of `[a.b]`, has no span of its own: it gets
/// its first key's).
struct NodeVisitor;

macro_rules! plain {
    ($($method:ident: $t:ty),*) => {
        $(fn $method<E: de::Error>(self, v: $t) -> Result<Node, E> {
            KindVisitor.$method(v).map(|kind| Node { span: 0..0, kind })
        })*
    };
}

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a TOML value")
    }
    plain!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64, visit_str: &str,
        visit_string: String);
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Node, A::Error> {
        KindVisitor
            .visit_seq(seq)
            .map(|kind| Node { span: 0..0, kind })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        use serde_spanned::__unstable as sp;
        let Some(first) = map.next_key::<Key>()? else {
            return Ok(Node {
                span: 0..0,
                kind: Kind::Table(Vec::new()),
            });
        };
        if first.name != sp::START_FIELD {
            let span = first.span.clone();
            let kind = KindVisitor::table(first, map)?;
            return Ok(Node { span, kind });
        }
        let start: usize = map.next_value()?;
        let (mut end, mut kind) = (start, None);
        while let Some(k) = map.next_key::<String>()? {
            match k.as_str() {
                sp::END_FIELD => end = map.next_value()?,
                _ => kind = Some(map.next_value::<Kind>()?),
            }
        }
        let kind = kind.ok_or_else(|| de::Error::missing_field(sp::VALUE_FIELD))?;
        Ok(Node {
            span: start..end,
            kind,
        })
    }
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(KindVisitor)
    }
}

struct KindVisitor;

impl<'de> Visitor<'de> for KindVisitor {
    type Value = Kind;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a TOML value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Kind, E> {
        Ok(Kind::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Kind, E> {
        Ok(Kind::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Kind, E> {
        i64::try_from(v)
            .map(Kind::Int)
            .map_err(|_| E::custom("integer out of range"))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Kind, E> {
        Ok(Kind::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Kind, E> {
        self.visit_string(v.to_owned())
    }
    fn visit_string<E: de::Error>(self, value: String) -> Result<Kind, E> {
        Ok(Kind::Str { value, var: None })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Kind, A::Error> {
        let mut items = Vec::new();
        while let Some(n) = seq.next_element::<Node>()? {
            items.push(n);
        }
        Ok(Kind::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Kind, A::Error> {
        match map.next_key::<Key>()? {
            Some(first) => KindVisitor::table(first, map),
            None => Ok(Kind::Table(Vec::new())),
        }
    }
}

impl KindVisitor {
    /// A table whose first key is read.
    fn table<'de, A: MapAccess<'de>>(first: Key, mut map: A) -> Result<Kind, A::Error> {
        if first.name.starts_with("$__toml_private") {
            map.next_value::<de::IgnoredAny>()?;
            return Ok(Kind::Datetime);
        }
        let mut entries = Vec::new();
        let mut key = Some(first);
        while let Some(k) = key {
            let value = map.next_value::<Node>()?;
            entries.push(Entry {
                key: k.name,
                key_span: k.span,
                value,
            });
            key = map.next_key::<Key>()?;
        }
        Ok(Kind::Table(entries))
    }
}

/// A table key with its span (toml's key deserializer gives spans to `Spanned` keys; a plain
/// string key, such as a date-time's marker, has none).
struct Key {
    name: String,
    span: Range<usize>,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde_spanned::__unstable as sp;
        static FIELDS: [&str; 3] = [sp::START_FIELD, sp::END_FIELD, sp::VALUE_FIELD];
        d.deserialize_struct(sp::NAME, &FIELDS, KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(Key {
            name: v.to_owned(),
            span: 0..0,
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Key, A::Error> {
        use serde_spanned::__unstable as sp;
        let (mut start, mut end, mut name) = (0, 0, String::new());
        while let Some(k) = map.next_key::<String>()? {
            match k.as_str() {
                sp::START_FIELD => start = map.next_value()?,
                sp::END_FIELD => end = map.next_value()?,
                sp::VALUE_FIELD => name = map.next_value()?,
                _ => {
                    map.next_value::<de::IgnoredAny>()?;
                }
            }
        }
        Ok(Key {
            name,
            span: start..end,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Vec<Entry> {
        let k = Kind::deserialize(toml::Deserializer::new(text)).unwrap();
        match k {
            Kind::Table(e) => e,
            _ => unreachable!(),
        }
    }

    #[test]
    fn keys_and_values_keep_their_spans() {
        let text = "workers = 2\n[limits]\nkeepalive_timeout = \"5s\"\n";
        let t = parse(text);
        assert_eq!(&text[t[0].key_span.clone()], "workers");
        assert_eq!(&text[t[0].value.span.clone()], "2");
        let Kind::Table(l) = &t[1].value.kind else {
            panic!()
        };
        assert_eq!(&text[l[0].key_span.clone()], "keepalive_timeout");
        assert_eq!(&text[l[0].value.span.clone()], "\"5s\"");
    }

    #[test]
    fn tables_merge_arrays_of_tables_append_scalars_conflict() {
        let mut a = parse("[[route]]\nprefix = \"/a\"\n[offload.engines.x]\nkind = \"pool\"\n");
        let b = parse("[[route]]\nprefix = \"/b\"\n[offload.engines.y]\nkind = \"pool\"\n");
        merge(&mut a, b, "").unwrap();
        let Kind::Array(routes) = &a[0].value.kind else {
            panic!()
        };
        assert_eq!(routes.len(), 2);
        let e = merge(
            &mut a,
            parse("[offload.engines.x]\nkind = \"inline\"\n"),
            "",
        )
        .unwrap_err();
        assert_eq!(e.key, "offload.engines.x.kind");
        let e = merge(&mut a, parse("route = 1\n"), "").unwrap_err();
        assert_eq!(e.key, "route");
    }
}
