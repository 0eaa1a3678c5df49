//! The `[compression]` section: response compression (negotiation, codecs and levels, which
//! responses, the offload mode and engine, chunking, the variant cache).

use std::time::Duration;

use qweb_compress::Codec;
use qweb_offload::Mode;
use serde::Deserialize;
use toml::Spanned;

use super::units::{Dur, Size};
use super::{ConfigError, OffloadConfig, Validator};

/// The section as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCompression {
    pub enabled: Option<bool>,
    pub codecs: Option<Spanned<Vec<Spanned<String>>>>,
    pub levels: Option<RawLevels>,
    pub min_size: Option<Size>,
    pub types: Option<Spanned<Vec<Spanned<String>>>>,
    pub mode: Option<Spanned<String>>,
    pub engine: Option<Spanned<String>>,
    pub chunk_size: Option<Spanned<Size>>,
    pub depth: Option<Spanned<usize>>,
    pub cache_size: Option<Size>,
    pub precompressed: Option<bool>,
    pub flush_interval: Option<Spanned<Dur>>,
    pub timeout: Option<Spanned<Dur>>,
}

/// `[compression.levels]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLevels {
    pub gzip: Option<Spanned<u32>>,
    pub br: Option<Spanned<u32>>,
    pub zstd: Option<Spanned<u32>>,
}

/// Response compression settings.
#[derive(Debug, Clone)]
pub struct CompressionConfig {
    /// Compress responses at all (on when the `[compression]` section is present).
    pub enabled: bool,
    /// Codecs offered, in the server's order of preference (ties between equal client
    /// weights go to the first).
    pub codecs: Vec<Codec>,
    /// Level per codec, indexed by [`Codec::index`].
    pub levels: [u32; 3],
    /// Bodies smaller than this (when their length is known) are sent as they are.
    pub min_size: u64,
    /// Compressible media types: `type/subtype` or `type/*`.
    pub types: Vec<String>,
    /// How chunks wait for the engine: `sync` is [`Mode::Sync`], `pipelined` [`Mode::Async`]
    /// (the fallback is always software; see [`qweb_offload::policy`]).
    pub mode: Mode,
    /// The engine that compresses chunks.
    pub engine: String,
    /// Input bytes per chunk.
    pub chunk_size: usize,
    /// Most chunks of one response in flight (pipelined mode).
    pub depth: usize,
    /// Bytes of compressed static-file variants kept per worker (0: no cache).
    pub cache_size: usize,
    /// Serve `file.gz`, `file.br`, `file.zst` next to a static file when newer.
    pub precompressed: bool,
    /// A streamed body that pauses this long with a partial chunk has it sent.
    pub flush_interval: Duration,
    /// Per-chunk engine timeout (then the chunk is compressed in software).
    pub timeout: Duration,
}

/// The default compressible media types.
pub const DEFAULT_TYPES: &[&str] = &[
    "text/*",
    "application/javascript",
    "application/x-javascript",
    "application/ecmascript",
    "application/json",
    "application/ld+json",
    "application/manifest+json",
    "application/xml",
    "application/xhtml+xml",
    "application/rss+xml",
    "application/atom+xml",
    "application/wasm",
    "application/x-sh",
    "image/svg+xml",
    "image/x-icon",
    "image/vnd.microsoft.icon",
    "image/bmp",
    "font/ttf",
    "font/otf",
    "application/vnd.ms-fontobject",
];

impl Default for CompressionConfig {
    fn default() -> Self {
        CompressionConfig {
            enabled: false,
            codecs: vec![Codec::Zstd, Codec::Brotli, Codec::Gzip],
            levels: [4, 4, 3],
            min_size: 1024,
            types: DEFAULT_TYPES.iter().map(|s| (*s).to_owned()).collect(),
            mode: Mode::Async,
            engine: "inline".into(),
            chunk_size: 64 * 1024,
            depth: 4,
            cache_size: 16 * 1024 * 1024,
            precompressed: true,
            flush_interval: Duration::from_millis(50),
            timeout: Duration::from_secs(5),
        }
    }
}

impl Validator<'_> {
    /// Validates `[compression]` against the configured engines.
    pub(super) fn compression(
        &self,
        raw: Option<&Spanned<RawCompression>>,
        offload: &OffloadConfig,
    ) -> Result<CompressionConfig, ConfigError> {
        let mut cfg = CompressionConfig::default();
        let Some(raw) = raw else {
            return Ok(cfg);
        };
        let r = raw.get_ref();
        cfg.enabled = r.enabled.unwrap_or(true);
        if let Some(list) = &r.codecs {
            cfg.codecs = self.codecs(list, cfg.enabled)?;
        }
        if let Some(l) = &r.levels {
            for (name, codec, v, range) in [
                ("gzip", Codec::Gzip, &l.gzip, 1..=9),
                ("br", Codec::Brotli, &l.br, 2..=11),
                ("zstd", Codec::Zstd, &l.zstd, 1..=19),
            ] {
                if let Some(v) = v {
                    if !range.contains(v.get_ref()) {
                        return Err(self.err(
                            Some(v.span()),
                            format!("compression.levels.{name}"),
                            format!(
                                "level {} is out of range ({}..={})",
                                v.get_ref(),
                                range.start(),
                                range.end()
                            ),
                        ));
                    }
                    cfg.levels[codec.index()] = *v.get_ref();
                }
            }
        }
        if let Some(s) = r.min_size {
            cfg.min_size = s.0;
        }
        if let Some(list) = &r.types {
            cfg.types = self.media_types(list)?;
        }
        if let Some(m) = &r.mode {
            cfg.mode = match m.get_ref().as_str() {
                "sync" => Mode::Sync,
                "pipelined" => Mode::Async,
                other => {
                    return Err(self.err(
                        Some(m.span()),
                        "compression.mode",
                        format!("unknown mode `{other}` (use \"sync\" or \"pipelined\")"),
                    ))
                }
            };
        }
        if let Some(e) = &r.engine {
            let name = e.get_ref();
            let found = offload.engines.iter().find(|x| &x.name == name);
            if found.is_some_and(|x| matches!(x.kind, super::EngineKind::Keyserver(_))) {
                return Err(self.err(
                    Some(e.span()),
                    "compression.engine",
                    format!("`{name}` is a key server engine: it signs, it cannot compress"),
                ));
            }
            if found.is_none() {
                let names: Vec<&str> = offload.engines.iter().map(|e| e.name.as_str()).collect();
                return Err(self.err(
                    Some(e.span()),
                    "compression.engine",
                    format!("no engine named `{name}` (defined: {})", names.join(", ")),
                ));
            }
            cfg.engine = name.clone();
        }
        if let Some(c) = &r.chunk_size {
            let v = c.get_ref().0;
            if !(1024..=8 * 1024 * 1024).contains(&v) {
                return Err(self.err(
                    Some(c.span()),
                    "compression.chunk_size",
                    "must be between 1KiB and 8MiB",
                ));
            }
            cfg.chunk_size = v as usize;
        }
        if let Some(d) = &r.depth {
            if !(1..=64).contains(d.get_ref()) {
                return Err(self.err(
                    Some(d.span()),
                    "compression.depth",
                    "must be between 1 and 64",
                ));
            }
            cfg.depth = *d.get_ref();
        }
        if let Some(s) = r.cache_size {
            cfg.cache_size = usize::try_from(s.0).unwrap_or(usize::MAX);
        }
        if let Some(p) = r.precompressed {
            cfg.precompressed = p;
        }
        for (key, v, slot) in [
            (
                "compression.flush_interval",
                &r.flush_interval,
                &mut cfg.flush_interval,
            ),
            ("compression.timeout", &r.timeout, &mut cfg.timeout),
        ] {
            if let Some(d) = v {
                if d.get_ref().0.is_zero() {
                    return Err(self.err(Some(d.span()), key, "must be greater than 0"));
                }
                *slot = d.get_ref().0;
            }
        }
        Ok(cfg)
    }

    /// `compression.codecs`: known, each once, at least one unless compression is off.
    fn codecs(
        &self,
        list: &Spanned<Vec<Spanned<String>>>,
        enabled: bool,
    ) -> Result<Vec<Codec>, ConfigError> {
        let mut codecs = Vec::new();
        for (i, c) in list.get_ref().iter().enumerate() {
            let codec = match c.get_ref().as_str() {
                "gzip" => Codec::Gzip,
                "br" => Codec::Brotli,
                "zstd" => Codec::Zstd,
                other => {
                    return Err(self.err(
                        Some(c.span()),
                        format!("compression.codecs[{i}]"),
                        format!("unknown codec `{other}` (use \"zstd\", \"br\" or \"gzip\")"),
                    ))
                }
            };
            if codecs.contains(&codec) {
                return Err(self.err(
                    Some(c.span()),
                    format!("compression.codecs[{i}]"),
                    format!("`{}` is listed twice", codec.token()),
                ));
            }
            codecs.push(codec);
        }
        if codecs.is_empty() && enabled {
            return Err(self.err(
                Some(list.span()),
                "compression.codecs",
                "at least one codec is needed (or `enabled = false`)",
            ));
        }
        Ok(codecs)
    }

    /// `compression.types`: media types (`type/subtype`, `type/*`), lower case.
    fn media_types(
        &self,
        list: &Spanned<Vec<Spanned<String>>>,
    ) -> Result<Vec<String>, ConfigError> {
        let mut types = Vec::new();
        for (i, t) in list.get_ref().iter().enumerate() {
            let v = t.get_ref().trim().to_ascii_lowercase();
            let ok = match v.split_once('/') {
                Some((a, b)) => {
                    !a.is_empty()
                        && !b.is_empty()
                        && a != "*"
                        && !b.contains('/')
                        && !v.contains(|c: char| c.is_whitespace() || c == ';')
                }
                None => false,
            };
            if !ok {
                return Err(self.err(
                    Some(t.span()),
                    format!("compression.types[{i}]"),
                    format!("`{v}` is not a media type (use e.g. \"text/html\" or \"text/*\")"),
                ));
            }
            types.push(v);
        }
        Ok(types)
    }
}

impl CompressionConfig {
    /// Is `content_type` (a `Content-Type` value, parameters allowed) compressible?
    pub fn compressible(&self, content_type: &str) -> bool {
        let essence = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let Some((top, _)) = essence.split_once('/') else {
            return false;
        };
        self.types.iter().any(|t| match t.strip_suffix("/*") {
            Some(prefix) => prefix == top,
            None => *t == essence,
        })
    }

    /// The level configured for `codec`.
    pub fn level(&self, codec: Codec) -> u32 {
        self.levels[codec.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;
    use std::path::Path;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_str_at(text, Some(Path::new("/etc/qweb/c.toml")))
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn off_without_the_section_on_with_it() {
        let c = parse("workers = 1\n").unwrap();
        assert!(!c.compression.enabled);
        let c = parse("[compression]\n").unwrap();
        let d = CompressionConfig::default();
        assert!(c.compression.enabled);
        assert_eq!(c.compression.codecs, d.codecs);
        assert_eq!(c.compression.min_size, 1024);
        assert_eq!(c.compression.chunk_size, 64 * 1024);
        assert_eq!(c.compression.mode, Mode::Async);
        assert_eq!(c.compression.engine, "inline");
        let c = parse("[compression]\nenabled = false\n").unwrap();
        assert!(!c.compression.enabled);
    }

    #[test]
    fn every_key() {
        let c = parse(
            "[offload.engines.zpool]\nkind = \"pool\"\nthreads = 2\n\
             [compression]\ncodecs = [\"gzip\", \"br\"]\nmin_size = \"2KiB\"\n\
             types = [\"text/html\", \"application/*\"]\nmode = \"sync\"\nengine = \"zpool\"\n\
             chunk_size = \"128KiB\"\ndepth = 8\ncache_size = \"1MiB\"\nprecompressed = false\n\
             flush_interval = \"10ms\"\ntimeout = \"1s\"\n\
             [compression.levels]\ngzip = 9\nbr = 5\nzstd = 19\n",
        )
        .unwrap();
        let z = &c.compression;
        assert_eq!(z.codecs, vec![Codec::Gzip, Codec::Brotli]);
        assert_eq!(z.levels, [9, 5, 19]);
        assert_eq!(z.min_size, 2048);
        assert_eq!(z.mode, Mode::Sync);
        assert_eq!(z.engine, "zpool");
        assert_eq!(z.chunk_size, 128 * 1024);
        assert_eq!(z.depth, 8);
        assert_eq!(z.cache_size, 1 << 20);
        assert!(!z.precompressed);
        assert_eq!(z.flush_interval, Duration::from_millis(10));
        assert_eq!(z.timeout, Duration::from_secs(1));
        assert!(z.compressible("application/json; charset=utf-8"));
        assert!(z.compressible("TEXT/HTML"));
        assert!(!z.compressible("text/css"));
        assert!(!z.compressible("image/png"));
    }

    #[test]
    fn default_types() {
        let d = CompressionConfig::default();
        for t in [
            "text/html; charset=utf-8",
            "text/css",
            "application/json",
            "image/svg+xml",
        ] {
            assert!(d.compressible(t), "{t}");
        }
        for t in [
            "image/png",
            "image/jpeg",
            "video/mp4",
            "application/zip",
            "application/gzip",
            "font/woff2",
            "application/octet-stream",
            "",
            "garbage",
        ] {
            assert!(!d.compressible(t), "{t}");
        }
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let e = err("[compression]\ncodecs = [\"gzip\", \"lzma\"]\n");
        assert!(e.starts_with("/etc/qweb/c.toml:2:"), "{e}");
        assert!(
            e.contains("compression.codecs[1]") && e.contains("lzma"),
            "{e}"
        );
        let e = err("[compression]\nmode = \"async\"\n");
        assert!(e.contains(":2:") && e.contains("compression.mode"), "{e}");
        let e = err("[compression]\nengine = \"nope\"\n");
        assert!(
            e.contains("compression.engine") && e.contains("inline"),
            "{e}"
        );
        let e = err("[compression]\nchunk_size = 10\n");
        assert!(e.contains("compression.chunk_size"), "{e}");
        let e = err("[compression]\ndepth = 0\n");
        assert!(e.contains("compression.depth"), "{e}");
        let e = err("[compression]\n\n[compression.levels]\ngzip = 10\n");
        assert!(
            e.contains(":4:") && e.contains("compression.levels.gzip"),
            "{e}"
        );
        let e = err("[compression]\ntypes = [\"html\"]\n");
        assert!(e.contains("compression.types[0]"), "{e}");
        let e = err("[compression]\nbogus = 1\n");
        assert!(e.contains("compression.bogus"), "{e}");
        let e = err("[compression]\nflush_interval = \"0ms\"\n");
        assert!(e.contains("compression.flush_interval"), "{e}");
        let e = err("[compression]\ncodecs = []\n");
        assert!(e.contains("compression.codecs"), "{e}");
        let e = err("[compression]\ncodecs = [\"br\", \"br\"]\n");
        assert!(e.contains("listed twice"), "{e}");
        let e = err(
            "[offload.engines.keys]\nkind = \"keyserver\"\nservers = [\"unix:/tmp/k.sock\"]\n\
             [compression]\nengine = \"keys\"\n",
        );
        assert!(
            e.contains("compression.engine") && e.contains("cannot compress"),
            "{e}"
        );
    }
}
