//! `basic_auth` on a route or a site (issue 39, phase 8): HTTP Basic authentication (RFC 7617)
//! against an Apache htpasswd file of bcrypt or argon2 hashes, checked after the access rules.
//!
//! The file is read when the configuration is validated (start, `qweb -t`, reload): a line
//! that is not `user:hash` with an accepted hash refuses the whole configuration, naming the
//! file and the line, so a reload with a bad file keeps the configuration that runs. The
//! verified-credentials cache lives here with the users (like a rate limit's state), so a
//! reload, which re-reads the file, starts from an empty cache.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lru::LruCache;
use serde::Deserialize;
use toml::Spanned;

use super::units::Dur;
use super::{ConfigError, Validator};

/// `max_pending` when the block does not say: verifications waiting or running at once for
/// one `basic_auth` block; past it a request is answered 503 at once.
pub const DEFAULT_BASIC_AUTH_MAX_PENDING: usize = 64;

/// The most `max_pending` may be.
pub const MAX_BASIC_AUTH_MAX_PENDING: usize = 100_000;

/// `cache_size` when the block does not say: credentials remembered as verified.
pub const DEFAULT_BASIC_AUTH_CACHE_SIZE: usize = 1024;

/// The most `cache_size` may be (about 100 bytes an entry).
pub const MAX_BASIC_AUTH_CACHE_SIZE: usize = 1_000_000;

/// `cache_ttl` when the block does not say.
pub const DEFAULT_BASIC_AUTH_CACHE_TTL: Duration = Duration::from_secs(60);

/// The longest `cache_ttl` may be.
pub const MAX_BASIC_AUTH_CACHE_TTL: Duration = Duration::from_secs(3600);

/// The most memory (KiB) an argon2 hash of the users file may ask for each verification:
/// 256 MiB (OWASP's recommended settings are 19 to 46 MiB).
pub const MAX_ARGON2_MEMORY_KIB: u32 = 256 * 1024;

/// The most passes an argon2 hash of the users file may ask for.
pub const MAX_ARGON2_PASSES: u32 = 16;

/// The longest a realm may be.
const MAX_REALM: usize = 256;

/// `basic_auth = { realm, users, forward_authorization, max_pending, cache_size, cache_ttl }`
/// as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBasicAuth {
    pub realm: Spanned<String>,
    pub users: Spanned<PathBuf>,
    pub forward_authorization: Option<bool>,
    pub max_pending: Option<Spanned<i64>>,
    pub cache_size: Option<Spanned<i64>>,
    pub cache_ttl: Option<Spanned<Dur>>,
}

/// A route's or a site's `basic_auth`.
#[derive(Debug, Clone)]
pub struct BasicAuth {
    /// The realm, as the challenge names it.
    pub realm: String,
    /// `WWW-Authenticate: Basic realm="...", charset="UTF-8"`.
    pub challenge: http::HeaderValue,
    /// A proxy route forwards the client's `Authorization` upstream (default: removed).
    pub forward_authorization: bool,
    /// The most verifications waiting or running at once for this block.
    pub max_pending: usize,
    /// Verifications waiting or running now (shared by the workers).
    pub pending: Arc<AtomicUsize>,
    /// The users and their hashes.
    pub users: Arc<Users>,
    /// Credentials verified lately.
    pub cache: Arc<VerifiedCache>,
}

/// An accepted password hash (the PHC or modular-crypt string as the file has it).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PasswordHash {
    /// `$2y$`, `$2a$`, `$2b$`.
    Bcrypt(String),
    /// `$argon2id$`, `$argon2i$` (a PHC string).
    Argon2(String),
}

impl std::fmt::Debug for PasswordHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PasswordHash::Bcrypt(_) => "Bcrypt(..)",
            PasswordHash::Argon2(_) => "Argon2(..)",
        })
    }
}

impl PasswordHash {
    /// Does `password` match? Costs what the hash says (bcrypt: 2^cost rounds; argon2: its
    /// memory and passes): call it off the event loop. Constant-time in the comparison (both
    /// crates compare the digests with `subtle`).
    pub fn verify(&self, password: &[u8]) -> bool {
        match self {
            PasswordHash::Bcrypt(h) => bcrypt::verify(password, h).unwrap_or(false),
            PasswordHash::Argon2(h) => {
                use argon2::PasswordVerifier;
                argon2::password_hash::PasswordHash::new(h).is_ok_and(|parsed| {
                    argon2::Argon2::default()
                        .verify_password(password, &parsed)
                        .is_ok()
                })
            }
        }
    }

    /// The hash of one line of a users file, or why it is refused.
    pub fn parse(text: &str) -> Result<PasswordHash, String> {
        const USE: &str = "use bcrypt (`htpasswd -B`) or argon2id";
        if ["$2y$", "$2a$", "$2b$"].iter().any(|p| text.starts_with(p)) {
            return match text.parse::<bcrypt::HashParts>() {
                Ok(_) => Ok(PasswordHash::Bcrypt(text.to_owned())),
                Err(e) => Err(format!("not a valid bcrypt hash ({e})")),
            };
        }
        if text.starts_with("$argon2id$") || text.starts_with("$argon2i$") {
            let parsed = argon2::password_hash::PasswordHash::new(text)
                .map_err(|e| format!("not a valid argon2 PHC string ({e})"))?;
            let params = argon2::Params::try_from(&parsed)
                .map_err(|e| format!("not valid argon2 parameters ({e})"))?;
            if params.m_cost() > MAX_ARGON2_MEMORY_KIB || params.t_cost() > MAX_ARGON2_PASSES {
                return Err(format!(
                    "argon2 with m={} t={} is over the {MAX_ARGON2_MEMORY_KIB} KiB and \
                     {MAX_ARGON2_PASSES} passes a verification may cost",
                    params.m_cost(),
                    params.t_cost()
                ));
            }
            if parsed.hash.is_none() {
                return Err("an argon2 PHC string without its hash".into());
            }
            return Ok(PasswordHash::Argon2(text.to_owned()));
        }
        Err(if text.starts_with("$apr1$") || text.starts_with("$1$") {
            format!("MD5 crypt hashes are refused (fast to guess): {USE}")
        } else if text.starts_with("{SHA}") {
            format!("SHA1 (`{{SHA}}`) hashes are refused (unsalted, fast to guess): {USE}")
        } else if text.starts_with("$argon2d$") {
            format!("argon2d is refused (side channels): {USE}")
        } else if text.starts_with("$5$") || text.starts_with("$6$") {
            format!("SHA-crypt hashes are not accepted: {USE}")
        } else if text.len() == 13
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'/')
        {
            format!("DES crypt hashes are refused (8 characters of password, fast to guess): {USE}")
        } else if text.starts_with('$') {
            format!("an unknown hash format: {USE}")
        } else {
            format!("looks like a plain-text password, which is refused: {USE}")
        })
    }
}

/// The users of one htpasswd file.
pub struct Users {
    users: HashMap<String, PasswordHash>,
    /// What an unknown user's password is checked against (the file's first hash, so an
    /// unknown user costs what a known one does); its answer is thrown away.
    dummy: PasswordHash,
}

impl std::fmt::Debug for Users {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Users")
            .field("count", &self.users.len())
            .finish()
    }
}

impl Users {
    /// Reads an htpasswd file: `user:hash` lines, `#` comments and blank lines. An error is
    /// `(line, reason)` (line 0: the whole file).
    pub fn parse(text: &str) -> Result<Users, (usize, String)> {
        let mut users = HashMap::new();
        let mut first = None;
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((user, hash)) = line.split_once(':') else {
                return Err((n, "not `user:hash`".into()));
            };
            if user.is_empty() || user.chars().any(char::is_control) {
                return Err((
                    n,
                    "an empty user name or one with control characters".into(),
                ));
            }
            let hash = PasswordHash::parse(hash.trim()).map_err(|m| (n, m))?;
            if users.contains_key(user) {
                return Err((n, format!("user `{user}` is already listed above")));
            }
            first.get_or_insert_with(|| hash.clone());
            users.insert(user.to_owned(), hash);
        }
        let dummy = first.ok_or((0, "no users".to_owned()))?;
        Ok(Users { users, dummy })
    }

    /// Checks `password` for `user`: an unknown user is checked against the dummy hash (as
    /// long as a known one) and fails.
    pub fn verify(&self, user: &str, password: &[u8]) -> bool {
        match self.users.get(user) {
            Some(h) => h.verify(password),
            None => {
                let _ = self.dummy.verify(password);
                false
            }
        }
    }

    /// How many users.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// No users (never: such a file is refused).
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

/// Credentials verified lately: the SHA-256 of the `Authorization` value (never the password)
/// and when it was verified; at most `cap` entries (least recently used evicted), each good
/// for `ttl`. Only successes are kept: a wrong password costs a verification every time.
pub struct VerifiedCache {
    ttl: Duration,
    map: Option<Mutex<LruCache<[u8; 32], Instant>>>,
}

impl std::fmt::Debug for VerifiedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifiedCache")
            .field("ttl", &self.ttl)
            .field("cap", &self.cap())
            .finish()
    }
}

impl VerifiedCache {
    /// A cache of `cap` entries (0: none) good for `ttl`.
    pub fn new(cap: usize, ttl: Duration) -> VerifiedCache {
        VerifiedCache {
            ttl,
            map: NonZeroUsize::new(cap).map(|c| Mutex::new(LruCache::new(c))),
        }
    }

    /// The most entries.
    pub fn cap(&self) -> usize {
        self.map.as_ref().map_or(0, |m| {
            m.lock().unwrap_or_else(PoisonError::into_inner).cap().get()
        })
    }

    /// Entries now (expired ones included until they are looked up or evicted).
    pub fn len(&self) -> usize {
        self.map.as_ref().map_or(0, |m| {
            m.lock().unwrap_or_else(PoisonError::into_inner).len()
        })
    }

    /// Empty?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Was `key` verified less than `ttl` ago?
    pub fn hit(&self, key: &[u8; 32]) -> bool {
        let Some(m) = &self.map else { return false };
        let mut m = m.lock().unwrap_or_else(PoisonError::into_inner);
        match m.get(key) {
            Some(at) if at.elapsed() < self.ttl => true,
            Some(_) => {
                m.pop(key);
                false
            }
            None => false,
        }
    }

    /// `key` was verified now.
    pub fn insert(&self, key: [u8; 32]) {
        if let Some(m) = &self.map {
            m.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .put(key, Instant::now());
        }
    }
}

/// A realm fit for a quoted-string: printable, no `"` or `\`.
fn realm(raw: &str) -> Result<http::HeaderValue, String> {
    let ok = !raw.is_empty()
        && raw.len() <= MAX_REALM
        && raw
            .chars()
            .all(|c| !c.is_control() && c != '"' && c != '\\' && c.is_ascii());
    if !ok {
        return Err(format!(
            "1 to {MAX_REALM} printable ASCII characters without `\"` or `\\`"
        ));
    }
    http::HeaderValue::from_str(&format!("Basic realm=\"{raw}\", charset=\"UTF-8\""))
        .map_err(|e| e.to_string())
}

/// Reads and checks the users file `path`.
pub fn read_users(path: &Path) -> Result<Users, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read users file `{}`: {e}", path.display()))?;
    Users::parse(&text).map_err(|(line, m)| match line {
        0 => format!("users file `{}`: {m}", path.display()),
        n => format!("users file `{}` line {n}: {m}", path.display()),
    })
}

impl Validator<'_> {
    /// `key`'s `basic_auth` (a route's or a site's).
    pub(super) fn basic_auth(
        &self,
        key: &str,
        r: &Spanned<RawBasicAuth>,
    ) -> Result<BasicAuth, ConfigError> {
        let raw = r.get_ref();
        let k = format!("{key}.basic_auth");
        let challenge = realm(raw.realm.get_ref())
            .map_err(|m| self.err(Some(raw.realm.span()), format!("{k}.realm"), m))?;
        let path = self.path(raw.users.get_ref(), raw.users.span());
        let users = read_users(&path)
            .map_err(|m| self.err(Some(raw.users.span()), format!("{k}.users"), m))?;
        let count = |v: &Option<Spanned<i64>>, name: &str, min: usize, max: usize, default| match v
        {
            None => Ok(default),
            Some(v) => usize::try_from(*v.get_ref())
                .ok()
                .filter(|n| (min..=max).contains(n))
                .ok_or_else(|| {
                    self.err(
                        Some(v.span()),
                        format!("{k}.{name}"),
                        format!("a count from {min} to {max}"),
                    )
                }),
        };
        let max_pending = count(
            &raw.max_pending,
            "max_pending",
            1,
            MAX_BASIC_AUTH_MAX_PENDING,
            DEFAULT_BASIC_AUTH_MAX_PENDING,
        )?;
        let cache_size = count(
            &raw.cache_size,
            "cache_size",
            0,
            MAX_BASIC_AUTH_CACHE_SIZE,
            DEFAULT_BASIC_AUTH_CACHE_SIZE,
        )?;
        let ttl = match &raw.cache_ttl {
            None => DEFAULT_BASIC_AUTH_CACHE_TTL,
            Some(t) if t.get_ref().0 <= MAX_BASIC_AUTH_CACHE_TTL => t.get_ref().0,
            Some(t) => {
                return Err(self.err(
                    Some(t.span()),
                    format!("{k}.cache_ttl"),
                    format!("at most {}s", MAX_BASIC_AUTH_CACHE_TTL.as_secs()),
                ))
            }
        };
        Ok(BasicAuth {
            realm: raw.realm.get_ref().clone(),
            challenge,
            forward_authorization: raw.forward_authorization.unwrap_or(false),
            max_pending,
            pending: Arc::default(),
            users: Arc::new(users),
            cache: Arc::new(VerifiedCache::new(cache_size, ttl)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bcrypt_and_argon2_are_accepted_and_each_refusal_says_why() {
        let b = bcrypt::hash("pw", 4).unwrap();
        let text = format!("# admins\n\nalice:{b}\n");
        let users = Users::parse(&text).unwrap();
        assert!(users.verify("alice", b"pw"));
        assert!(!users.verify("alice", b"pW"));
        assert!(
            !users.verify("bob", b"pw"),
            "unknown: checked against the dummy"
        );
        for (hash, why) in [
            ("$apr1$abc$defghijklmnopqrstuvwx.", "MD5"),
            ("{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=", "SHA1"),
            ("rl0uE2bHSvp5A", "DES crypt"),
            ("hunter2", "plain-text"),
            ("$6$salt$abc", "SHA-crypt"),
            ("$argon2d$v=19$m=16,t=2,p=1$c2FsdHNhbHQ$aGFzaA", "argon2d"),
            ("$2y$04$short", "bcrypt"),
            ("$9$x", "unknown"),
        ] {
            let e = Users::parse(&format!("ok:{b}\n# c\nbad:{hash}\n"))
                .err()
                .unwrap_or_else(|| panic!("{hash} accepted"));
            assert_eq!(e.0, 3, "{hash}");
            assert!(e.1.contains(why), "{hash}: {}", e.1);
        }
        assert_eq!(Users::parse("# none\n").err().unwrap().0, 0);
        assert_eq!(Users::parse("nocolon\n").err().unwrap().0, 1);
    }

    #[test]
    fn argon2_phc_strings_verify() {
        use argon2::password_hash::{PasswordHasher, SaltString};
        let salt = SaltString::encode_b64(b"0123456789abcdef").unwrap();
        let params = argon2::Params::new(64, 1, 1, None).unwrap();
        let a = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let h = a.hash_password(b"pw", &salt).unwrap().to_string();
        let users = Users::parse(&format!("carol:{h}\n")).unwrap();
        assert!(users.verify("carol", b"pw") && !users.verify("carol", b"px"));
        let huge = "$argon2id$v=19$m=1048576,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA";
        assert!(PasswordHash::parse(huge).unwrap_err().contains("KiB"));
    }

    #[test]
    fn the_cache_is_bounded_and_forgets_after_its_ttl() {
        let c = VerifiedCache::new(2, Duration::from_millis(50));
        c.insert([1; 32]);
        c.insert([2; 32]);
        c.insert([3; 32]);
        assert_eq!(c.len(), 2);
        assert!(!c.hit(&[1; 32]) && c.hit(&[3; 32]));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!c.hit(&[3; 32]));
        assert!(!VerifiedCache::new(0, Duration::from_secs(1)).hit(&[0; 32]));
    }
}
