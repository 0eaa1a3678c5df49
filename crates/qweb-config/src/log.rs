//! `[log]`: the access log (on or off, where the lines go, their `format`) and the level of
//! everything else.

use std::path::{Path, PathBuf};

use super::raw::RawLog;
use super::{ConfigError, Validator};

/// Logging settings.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// One access-log line per request on stdout.
    pub access: bool,
    /// Log filter for everything else (stderr), e.g. `info` or `qweb=debug`.
    pub level: String,
    /// Access log to this file (appended; reopened on SIGUSR1) instead of stdout.
    pub access_file: Option<PathBuf>,
    /// The access-log line format.
    pub format: AccessFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            access: true,
            level: "info".into(),
            access_file: None,
            format: AccessFormat::default(),
        }
    }
}

/// The shape of an access-log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AccessFormat {
    /// qweb's own: `<client> "<method> <target> <protocol>" <status> <bytes> <ms>`, after
    /// the log's timestamp.
    #[default]
    Qweb,
    /// nginx's `combined`, plus the request time (seconds) and the TLS version:
    /// `<client> - - [<time>] "<request>" <status> <bytes> "<referer>" "<user agent>" <s> <tls>`.
    Combined,
    /// One JSON object per line.
    Json,
}

impl Validator<'_> {
    /// Validates `[log]`.
    pub(super) fn log(&self, raw: &RawLog) -> Result<LogConfig, ConfigError> {
        let mut log = LogConfig::default();
        if let Some(a) = raw.access {
            log.access = a;
        }
        if let Some(level) = &raw.level {
            let v = level.get_ref().trim();
            if v.is_empty() {
                return Err(self.err(Some(level.span()), "log.level", "must not be empty"));
            }
            log.level = v.to_owned();
        }
        self.access_log(raw, &mut log)?;
        Ok(log)
    }

    /// Validates `log.access_file` and `log.format` into `log`.
    fn access_log(&self, raw: &RawLog, log: &mut LogConfig) -> Result<(), ConfigError> {
        if let Some(f) = &raw.access_file {
            let v = f.get_ref().trim();
            if v.is_empty() {
                return Err(self.err(Some(f.span()), "log.access_file", "must not be empty"));
            }
            let path: PathBuf = self.path(Path::new(v), f.span());
            if path.is_dir() {
                return Err(self.err(
                    Some(f.span()),
                    "log.access_file",
                    format!("{} is a folder", path.display()),
                ));
            }
            log.access_file = Some(path);
        }
        if let Some(f) = &raw.format {
            log.format = match f.get_ref().as_str() {
                "qweb" => AccessFormat::Qweb,
                "combined" => AccessFormat::Combined,
                "json" => AccessFormat::Json,
                other => {
                    return Err(self.err(
                        Some(f.span()),
                        "log.format",
                        format!("unknown format `{other}` (qweb, combined, json)"),
                    ))
                }
            };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn load(log: &str) -> Result<Config, ConfigError> {
        let text = format!("[log]\n{log}\n[[listener]]\naddress = \"127.0.0.1:0\"\n");
        Config::from_str_at(&text, Some(Path::new("/etc/qweb/q.toml")))
    }

    #[test]
    fn defaults_keep_the_qweb_format_on_stdout() {
        let c = load("").unwrap();
        assert_eq!(c.log.format, AccessFormat::Qweb);
        assert_eq!(c.log.access_file, None);
    }

    #[test]
    fn formats_and_a_relative_file_resolve() {
        let c = load("format = \"json\"\naccess_file = \"logs/access.log\"").unwrap();
        assert_eq!(c.log.format, AccessFormat::Json);
        assert_eq!(
            c.log.access_file.as_deref(),
            Some(Path::new("/etc/qweb/logs/access.log"))
        );
        assert_eq!(
            load("format = \"combined\"").unwrap().log.format,
            AccessFormat::Combined
        );
    }

    #[test]
    fn bad_values_are_located() {
        let e = load("format = \"xml\"").unwrap_err().to_string();
        assert!(e.contains("q.toml:2:10") && e.contains("log.format"), "{e}");
        assert!(e.contains("qweb, combined, json"), "{e}");
        let e = load("access_file = \"\"").unwrap_err().to_string();
        assert!(
            e.contains("q.toml:2:15") && e.contains("log.access_file"),
            "{e}"
        );
        let e = load("access_file = \"/\"").unwrap_err().to_string();
        assert!(e.contains("is a folder"), "{e}");
    }
}
