//! A serde deserializer over a merged [`Node`] tree: the configuration's typed form
//! (`RawConfig`) is read from it as from TOML text, with `toml::Spanned` spans (global
//! offsets, see [`super::Sources`]) and errors that carry the span of the value or key at
//! fault.
//!
//! One difference from TOML: a string that was a single environment variable reference
//! (`workers = "${WORKERS}"`) is read as an integer, a float or a boolean where the key
//! expects one, so that numbers and switches can come from the environment too.

use std::fmt;
use std::ops::Range;

use serde::de::value::{BorrowedStrDeserializer, UsizeDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, Visitor};
use serde::forward_to_deserialize_any;

use super::tree::{Entry, Kind, Node};

/// A deserialization error and the span it is about, when known.
#[derive(Debug)]
pub(crate) struct Error {
    pub message: String,
    pub span: Option<Range<usize>>,
}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error {
            message: msg.to_string(),
            span: None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// Gives an error without a span this one (the innermost value that failed keeps its own).
fn at(span: Range<usize>) -> impl FnOnce(Error) -> Error {
    move |mut e| {
        if e.span.is_none() {
            e.span = Some(span);
        }
        e
    }
}

/// Deserializes from one node.
pub(crate) struct NodeDe(pub Node);

/// What a key expects, for a string from one environment variable.
#[derive(Clone, Copy)]
enum Want {
    Int,
    Float,
    Bool,
}

impl NodeDe {
    /// A number or boolean from a whole-string `${VAR}`; anything else as written.
    fn coerce<'de, V: Visitor<'de>>(self, want: Want, v: V) -> Result<V::Value, Error> {
        let Node { span, kind } = self.0;
        let Kind::Str {
            value,
            var: Some(var),
        } = kind
        else {
            return NodeDe(Node { span, kind }).deserialize_any(v);
        };
        let t = value.trim();
        let r = match want {
            Want::Int => match t.parse::<i64>() {
                Ok(n) => Some(v.visit_i64(n)),
                Err(_) => t.parse::<u64>().ok().map(|n| v.visit_u64(n)),
            },
            Want::Float => t.parse::<f64>().ok().map(|n| v.visit_f64(n)),
            Want::Bool => match t {
                "true" => Some(v.visit_bool(true)),
                "false" => Some(v.visit_bool(false)),
                _ => None,
            },
        };
        let what = match want {
            Want::Int => "an integer",
            Want::Float => "a number",
            Want::Bool => "true or false",
        };
        r.unwrap_or_else(|| {
            Err(de::Error::custom(format!(
                "environment variable `{var}` is \"{value}\": expected {what}"
            )))
        })
        .map_err(at(span))
    }
}

macro_rules! coerce {
    ($($method:ident => $want:expr),* $(,)?) => {
        $(fn $method<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
            self.coerce($want, v)
        })*
    };
}

impl<'de> Deserializer<'de> for NodeDe {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        let Node { span, kind } = self.0;
        let r = match kind {
            Kind::Str { value, .. } => v.visit_string(value),
            Kind::Int(n) => v.visit_i64(n),
            Kind::Float(n) => v.visit_f64(n),
            Kind::Bool(b) => v.visit_bool(b),
            Kind::Datetime => Err(de::Error::custom(
                "a date-time has no meaning here (quote it to make it a string)",
            )),
            Kind::Array(items) => v.visit_seq(de::value::SeqDeserializer::new(
                items.into_iter().map(NodeDe),
            )),
            Kind::Table(entries) => v.visit_map(TableDe {
                entries: entries.into_iter(),
                value: None,
            }),
        };
        r.map_err(at(span))
    }

    coerce! {
        deserialize_bool => Want::Bool,
        deserialize_i8 => Want::Int, deserialize_i16 => Want::Int,
        deserialize_i32 => Want::Int, deserialize_i64 => Want::Int,
        deserialize_u8 => Want::Int, deserialize_u16 => Want::Int,
        deserialize_u32 => Want::Int, deserialize_u64 => Want::Int,
        deserialize_f32 => Want::Float, deserialize_f64 => Want::Float,
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, Error> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        let span = self.0.span.clone();
        SpannedDe::or_any(span, self, name, fields, v)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        let Node { span, kind } = self.0;
        match kind {
            Kind::Str { value, .. } => v
                .visit_enum(IntoDeserializer::<Error>::into_deserializer(value))
                .map_err(at(span)),
            kind => NodeDe(Node { span, kind }).deserialize_any(v),
        }
    }

    forward_to_deserialize_any! {
        i128 u128 char str string bytes byte_buf unit unit_struct seq tuple tuple_struct
        map identifier ignored_any
    }
}

impl<'de> IntoDeserializer<'de, Error> for NodeDe {
    type Deserializer = NodeDe;
    fn into_deserializer(self) -> NodeDe {
        self
    }
}

/// A table's entries, in file order.
struct TableDe {
    entries: std::vec::IntoIter<Entry>,
    value: Option<Node>,
}

impl<'de> MapAccess<'de> for TableDe {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some(e) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some(e.value);
        let span = e.key_span.clone();
        seed.deserialize(KeyDe {
            name: e.key,
            span: e.key_span,
        })
        .map(Some)
        .map_err(at(span))
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, Error> {
        match self.value.take() {
            Some(n) => seed.deserialize(NodeDe(n)),
            None => Err(de::Error::custom("a value without its key")),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

/// A table key (a struct field name, or a map key).
struct KeyDe {
    name: String,
    span: Range<usize>,
}

impl<'de> Deserializer<'de> for KeyDe {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_string(self.name)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        let span = self.span.clone();
        SpannedDe::or_any(span, self, name, fields, v)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

impl<'de> IntoDeserializer<'de, Error> for KeyDe {
    type Deserializer = KeyDe;
    fn into_deserializer(self) -> KeyDe {
        self
    }
}

/// `toml::Spanned`'s view of a value: its start, its end, then the value.
struct SpannedDe<D> {
    span: Range<usize>,
    value: Option<D>,
    field: usize,
}

impl<'de, D: Deserializer<'de, Error = Error>> SpannedDe<D> {
    /// `d` (written at `span`) as `toml::Spanned` asks for it when `name` and `fields` are
    /// its, else as itself.
    fn or_any<V: Visitor<'de>>(
        span: Range<usize>,
        d: D,
        name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        if !serde_spanned::__unstable::is_spanned(name, fields) {
            return d.deserialize_any(v);
        }
        v.visit_map(SpannedDe {
            span,
            value: Some(d),
            field: 0,
        })
    }
}

impl<'de, D: Deserializer<'de, Error = Error>> MapAccess<'de> for SpannedDe<D> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        use serde_spanned::__unstable as sp;
        let name = match self.field {
            0 => sp::START_FIELD,
            1 => sp::END_FIELD,
            2 => sp::VALUE_FIELD,
            _ => return Ok(None),
        };
        seed.deserialize(BorrowedStrDeserializer::new(name))
            .map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, Error> {
        self.field += 1;
        match self.field {
            1 => seed.deserialize(UsizeDeserializer::new(self.span.start)),
            2 => seed.deserialize(UsizeDeserializer::new(self.span.end)),
            _ => match self.value.take() {
                Some(d) => seed.deserialize(d),
                None => Err(de::Error::custom("a spanned value read twice")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct T {
        n: toml::Spanned<u16>,
        s: Option<String>,
        list: Vec<toml::Spanned<String>>,
    }

    fn node(text: &str) -> Node {
        Node {
            span: 0..text.len(),
            kind: Kind::deserialize(toml::Deserializer::new(text)).unwrap(),
        }
    }

    #[test]
    fn reads_spanned_values_and_reports_spans() {
        let text = "n = 7\ns = \"x\"\nlist = [\"a\", \"bc\"]\n";
        let t = T::deserialize(NodeDe(node(text))).unwrap();
        assert_eq!(*t.n.get_ref(), 7);
        assert_eq!(&text[t.n.span()], "7");
        assert_eq!(&text[t.list[1].span()], "\"bc\"");
        assert_eq!(t.s.as_deref(), Some("x"));

        let text = "n = 70000\nlist = []\n";
        let e = T::deserialize(NodeDe(node(text)))
            .err()
            .expect("out of range");
        assert_eq!(&text[e.span.unwrap()], "70000");
        let text = "n = 1\nlist = []\nbogus = 2\n";
        let e = T::deserialize(NodeDe(node(text))).err().expect("unknown");
        assert_eq!(&text[e.span.unwrap()], "bogus");
    }

    #[test]
    fn a_whole_string_variable_becomes_a_number_where_one_is_expected() {
        let mut n = node("n = \"8080\"\nlist = [\"8080\"]\n");
        if let Kind::Table(e) = &mut n.kind {
            if let Kind::Str { var, .. } = &mut e[0].value.kind {
                *var = Some("PORT".into());
            }
        }
        let t = T::deserialize(NodeDe(n.clone())).unwrap();
        assert_eq!(*t.n.get_ref(), 8080);
        assert_eq!(t.list[0].get_ref(), "8080");
        if let Kind::Table(e) = &mut n.kind {
            e[0].value.kind = Kind::Str {
                value: "http".into(),
                var: Some("PORT".into()),
            };
        }
        let e = T::deserialize(NodeDe(n)).err().expect("not a number");
        assert!(e.message.contains("`PORT` is \"http\""), "{}", e.message);
    }
}
