//! Session tickets: a rustls [`ProducesTickets`] with AES-256-GCM (aws-lc-rs) and rotating
//! keys, one per process (every worker's `ServerConfig` holds the same [`Ticketer`]).
//!
//! A ticket is `key name (16) || nonce (12) || AES-256-GCM(session state) || tag (16)`, the
//! key name being the additional data. The AEAD key is HKDF-SHA256 of the key's secret
//! (salt `qweb ticket key v1`, info the key name), so a key is just a name and a secret: 16
//! random bytes and 32 random bytes, or nginx's `ssl_session_ticket_key` file layout.
//!
//! Keys come from one of three places:
//! - **local**: random keys made by this process, rotated every `rotation`; the previous
//!   key still decrypts for one more period, so a ticket resumes for one to two periods.
//! - **file** ([`parse_key_file`]): the operator's keys (the first encrypts, all decrypt); when
//!   the file changes the key it replaced still decrypts, so tickets survive one change.
//! - **fleet** ([`FleetKeys`], from the key server): previous, current and next key and when
//!   the next one takes over; the switch happens here at that time even when the key server
//!   cannot be reached, and the next key decrypts already (a node that switched a moment
//!   earlier is understood). Fleet keys retire by their age like local ones, heard from the
//!   key server or not: when the next key's period ends and no newer fleet key came, this
//!   process encrypts with local random keys (rotated every `rotation`) until the key server
//!   answers again, so no ticket resumes more than two of the fleet's periods after its key
//!   started encrypting. Tickets issued on those local keys resume on this node only, and
//!   not after the fleet's keys are back (a full handshake).
//!
//! Decryption never panics on hostile input: too short, too long, unknown key name, or a
//! failed tag are all `None` (a full handshake follows).
//!
//! Key material does not outlive its use: a [`TicketKeyMaterial`] is zeroized when it is
//! dropped (every copy: the key server's ring, the fleet's keys as received, a key file's
//! keys), the derived AEAD key is zeroized once aws-lc holds it, and aws-lc cleanses its own
//! copy (the AEAD context) when a retired key is dropped (`OPENSSL_free` wipes every
//! allocation). A ticketer holds at most the current key, the previous one and, with fleet
//! keys, the next one.

use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use aws_lc_rs::hkdf;
use rustls::server::ProducesTickets;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

/// Bytes of a key name.
pub const KEY_NAME_LEN: usize = 16;
/// Bytes of a key secret (what the AEAD key is derived from).
pub const KEY_SECRET_LEN: usize = 32;
const TAG_LEN: usize = 16;
/// Longest ticket accepted for decryption: rustls' session state is a few hundred bytes
/// (more with client certificates); anything longer is not ours.
const MAX_TICKET: usize = 16 * 1024;
/// TLS 1.3 caps a ticket's lifetime at 7 days (RFC 8446 §4.6.1).
const MAX_LIFETIME_SECS: u64 = 7 * 24 * 3600;

/// The clock tickets are rotated by (injectable for tests).
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// One ticket key as material: a name and a secret. Zeroized when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct TicketKeyMaterial {
    /// The name written at the front of every ticket it encrypts.
    pub name: [u8; KEY_NAME_LEN],
    /// The secret the AEAD key is derived from (at least 16 bytes).
    pub secret: Vec<u8>,
}

impl fmt::Debug for TicketKeyMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // never the secret
        f.debug_struct("TicketKeyMaterial")
            .field("name", &hex(&self.name))
            .finish_non_exhaustive()
    }
}

impl Zeroize for TicketKeyMaterial {
    fn zeroize(&mut self) {
        self.name.zeroize();
        // the bytes, then the length (and any spare capacity)
        self.secret.zeroize();
        #[cfg(test)]
        tests::ZEROIZED.with(|n| n.set(n.get() + 1));
    }
}

impl Drop for TicketKeyMaterial {
    fn drop(&mut self) {
        self.zeroize();
    }
}

impl ZeroizeOnDrop for TicketKeyMaterial {}

impl TicketKeyMaterial {
    /// A random key (name and secret from the system's CSPRNG).
    pub fn random() -> Result<Self, TicketError> {
        let mut name = [0u8; KEY_NAME_LEN];
        let mut secret = vec![0u8; KEY_SECRET_LEN];
        aws_lc_rs::rand::fill(&mut name).map_err(|_| TicketError::Random)?;
        aws_lc_rs::rand::fill(&mut secret).map_err(|_| TicketError::Random)?;
        Ok(TicketKeyMaterial { name, secret })
    }
}

/// A ticket key's material is unusable, or randomness failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TicketError {
    /// The system's random generator failed.
    #[error("the random generator failed")]
    Random,
    /// A key file's size is not a multiple of 80 or 48 bytes.
    #[error("a ticket key file holds 80-byte keys (or 48-byte keys, as nginx's `ssl_session_ticket_key`); this one has {0} bytes")]
    FileSize(usize),
    /// A key secret shorter than 16 bytes.
    #[error("a ticket key secret must have at least 16 bytes")]
    ShortSecret,
    /// Two keys of one set share a name.
    #[error("two ticket keys have the same name")]
    DuplicateName,
}

/// Parses a key file in nginx's `ssl_session_ticket_key` layout: one or more keys of 80 bytes
/// (16 name, 32 + 32 secret) or of 48 bytes (16 name, 16 + 16 secret), all of one size. The
/// first key encrypts; all of them decrypt.
pub fn parse_key_file(bytes: &[u8]) -> Result<Vec<TicketKeyMaterial>, TicketError> {
    let size = if !bytes.is_empty() && bytes.chunks_exact(80).remainder().is_empty() {
        80
    } else if !bytes.is_empty() && bytes.chunks_exact(48).remainder().is_empty() {
        48
    } else {
        return Err(TicketError::FileSize(bytes.len()));
    };
    let keys: Vec<TicketKeyMaterial> = bytes
        .chunks_exact(size)
        .map(|c| {
            let mut name = [0u8; KEY_NAME_LEN];
            name.copy_from_slice(&c[..KEY_NAME_LEN]);
            TicketKeyMaterial {
                name,
                secret: c[KEY_NAME_LEN..].to_vec(),
            }
        })
        .collect();
    for (i, k) in keys.iter().enumerate() {
        if keys[..i].iter().any(|o| o.name == k.name) {
            return Err(TicketError::DuplicateName);
        }
    }
    Ok(keys)
}

/// A key ready to seal and open tickets.
struct Key {
    name: [u8; KEY_NAME_LEN],
    aead: LessSafeKey,
    /// When it started encrypting (or was loaded), for the key-age metric.
    since: SystemTime,
}

impl Key {
    fn new(m: &TicketKeyMaterial, since: SystemTime) -> Result<Key, TicketError> {
        if m.secret.len() < 16 {
            return Err(TicketError::ShortSecret);
        }
        let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, b"qweb ticket key v1");
        let prk = salt.extract(&m.secret);
        let info = [&m.name[..]];
        // wiped when it goes out of scope: aws-lc holds its own copy (cleansed when freed)
        let mut raw = Zeroizing::new([0u8; 32]);
        prk.expand(&info, hkdf::HKDF_SHA256)
            .and_then(|okm| okm.fill(&mut raw[..]))
            .map_err(|_| TicketError::Random)?;
        let key = UnboundKey::new(&AES_256_GCM, &raw[..]).map_err(|_| TicketError::Random)?;
        Ok(Key {
            name: m.name,
            aead: LessSafeKey::new(key),
            since,
        })
    }

    fn seal(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let mut nonce = [0u8; NONCE_LEN];
        aws_lc_rs::rand::fill(&mut nonce).ok()?;
        let mut out = Vec::with_capacity(KEY_NAME_LEN + NONCE_LEN + plain.len() + TAG_LEN);
        out.extend_from_slice(&self.name);
        out.extend_from_slice(&nonce);
        let mut body = plain.to_vec();
        self.aead
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&self.name),
                &mut body,
            )
            .ok()?;
        out.extend_from_slice(&body);
        Some(out)
    }

    fn open(&self, nonce: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut body = sealed.to_vec();
        let plain = self
            .aead
            .open_in_place(nonce, Aad::from(&self.name), &mut body)
            .ok()?;
        let n = plain.len();
        body.truncate(n);
        Some(body)
    }
}

/// The keys of a fleet, as the key server hands them out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetKeys {
    /// The key that encrypted until the last rotation (decrypts only).
    pub previous: Option<TicketKeyMaterial>,
    /// The key that encrypts now.
    pub current: TicketKeyMaterial,
    /// The key that encrypts after the next rotation (decrypts already).
    pub next: TicketKeyMaterial,
    /// How long until `next` takes over.
    pub next_in: Duration,
    /// How long `current` has been encrypting.
    pub current_age: Duration,
    /// The rotation period.
    pub rotation: Duration,
}

impl FleetKeys {
    /// A new ring: a random current and next key, no previous one, rotated every
    /// `rotation`.
    pub fn random(rotation: Duration) -> Result<FleetKeys, TicketError> {
        Ok(FleetKeys {
            previous: None,
            current: TicketKeyMaterial::random()?,
            next: TicketKeyMaterial::random()?,
            next_in: rotation,
            current_age: Duration::ZERO,
            rotation,
        })
    }

    /// Rotates a ring whose `current_age` has grown (the one place a ring rotates: the key
    /// server's, and the fleet store's): every period over, the next key encrypts, the
    /// current one becomes the previous, a random one is the next; after more than two
    /// periods idle nothing from before is kept (a new ring, age zero). Sets `next_in`.
    pub fn advance(&mut self) -> Result<(), TicketError> {
        let rotation = self.rotation.max(Duration::from_secs(1));
        let mut turns = 0;
        while self.current_age >= rotation {
            turns += 1;
            if turns > 2 {
                *self = FleetKeys::random(rotation)?;
                break;
            }
            let next = std::mem::replace(&mut self.next, TicketKeyMaterial::random()?);
            let old = std::mem::replace(&mut self.current, next);
            self.previous = Some(old);
            self.current_age -= rotation;
        }
        self.next_in = rotation.saturating_sub(self.current_age);
        Ok(())
    }
}

/// Where the keys come from now.
enum Mode {
    /// Random keys, a new one every period.
    Local,
    /// Fixed keys (a file); no rotation here.
    Fixed,
    /// A fleet's keys: `next` takes over at `switch_at`.
    Fleet,
}

struct State {
    mode: Mode,
    current: Key,
    /// Decrypt-only keys: the previous current key, and a file's other keys.
    older: Vec<Key>,
    /// A fleet's next key (decrypts already).
    next: Option<Key>,
    /// When the next rotation happens (`Local`, `Fleet`).
    switch_at: Option<SystemTime>,
    /// How long a key encrypts (`Local`, `Fleet`): the ticketer's `rotation` for local keys,
    /// the fleet's period for its keys and for the local keys that follow them when the key
    /// server is not heard from.
    period: Duration,
}

/// The process's ticket producer, shared by every worker (it is `Send + Sync`; the keys sit
/// behind a read-write lock that is written only at rotation).
pub struct Ticketer {
    state: RwLock<State>,
    rotation: Duration,
    clock: Clock,
}

impl fmt::Debug for Ticketer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticketer")
            .field("rotation", &self.rotation)
            .finish_non_exhaustive()
    }
}

impl Ticketer {
    /// Random keys rotated every `rotation` (at least 1 s), on the system clock.
    pub fn local(rotation: Duration) -> Result<Arc<Ticketer>, TicketError> {
        Self::local_with_clock(rotation, Arc::new(SystemTime::now))
    }

    /// [`Ticketer::local`] on a given clock.
    pub fn local_with_clock(
        rotation: Duration,
        clock: Clock,
    ) -> Result<Arc<Ticketer>, TicketError> {
        let rotation = rotation.max(Duration::from_secs(1));
        let now = clock();
        let current = Key::new(&TicketKeyMaterial::random()?, now)?;
        Ok(Arc::new(Ticketer {
            state: RwLock::new(State {
                mode: Mode::Local,
                current,
                older: Vec::new(),
                next: None,
                switch_at: Some(now + rotation),
                period: rotation,
            }),
            rotation,
            clock,
        }))
    }

    /// Fixed keys (from a key file): the first encrypts, all decrypt. `lifetime` is the
    /// lifetime hint given to clients.
    pub fn fixed(
        keys: &[TicketKeyMaterial],
        lifetime: Duration,
    ) -> Result<Arc<Ticketer>, TicketError> {
        Self::fixed_with_clock(keys, lifetime, Arc::new(SystemTime::now))
    }

    /// [`Ticketer::fixed`] on a given clock.
    pub fn fixed_with_clock(
        keys: &[TicketKeyMaterial],
        lifetime: Duration,
        clock: Clock,
    ) -> Result<Arc<Ticketer>, TicketError> {
        let now = clock();
        let (current, older) = Self::build_fixed(keys, now)?;
        Ok(Arc::new(Ticketer {
            state: RwLock::new(State {
                mode: Mode::Fixed,
                current,
                older,
                next: None,
                switch_at: None,
                period: lifetime.max(Duration::from_secs(1)),
            }),
            rotation: lifetime.max(Duration::from_secs(1)),
            clock,
        }))
    }

    fn build_fixed(
        keys: &[TicketKeyMaterial],
        now: SystemTime,
    ) -> Result<(Key, Vec<Key>), TicketError> {
        let (first, rest) = keys.split_first().ok_or(TicketError::FileSize(0))?;
        let current = Key::new(first, now)?;
        let older = rest
            .iter()
            .map(|k| Key::new(k, now))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((current, older))
    }

    /// Replaces fixed keys (the key file changed). The key that encrypted until now keeps
    /// decrypting, so tickets issued before the change still resume.
    pub fn reload_fixed(&self, keys: &[TicketKeyMaterial]) -> Result<(), TicketError> {
        let now = (self.clock)();
        let (current, mut older) = Self::build_fixed(keys, now)?;
        let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
        if st.current.name == current.name {
            // same encrypting key: keep its age
            let old = std::mem::replace(&mut st.current, current);
            st.current.since = old.since;
        } else {
            let old = std::mem::replace(&mut st.current, current);
            if !older.iter().any(|k| k.name == old.name) {
                older.push(old);
            }
        }
        st.older = older;
        st.mode = Mode::Fixed;
        st.switch_at = None;
        st.next = None;
        Ok(())
    }

    /// Installs a fleet's keys (from the key server). From now on the keys rotate when the
    /// fleet says, here, even if the key server is not heard from again: `next` takes over
    /// in `next_in`, and one fleet period later, with no newer keys installed by then, local
    /// random keys do (the fleet's keys are retired by their age, see the module's doc).
    pub fn install_fleet(&self, keys: &FleetKeys) -> Result<(), TicketError> {
        let now = (self.clock)();
        let since = now.checked_sub(keys.current_age).unwrap_or(now);
        let current = Key::new(&keys.current, since)?;
        let next = Key::new(&keys.next, now + keys.next_in)?;
        let older = match &keys.previous {
            Some(p) => vec![Key::new(p, since)?],
            None => Vec::new(),
        };
        if current.name == next.name
            || older
                .iter()
                .any(|o| o.name == current.name || o.name == next.name)
        {
            return Err(TicketError::DuplicateName);
        }
        let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
        st.mode = Mode::Fleet;
        st.current = current;
        st.older = older;
        st.next = Some(next);
        st.switch_at = Some(now + keys.next_in);
        st.period = keys.rotation.max(Duration::from_secs(1));
        Ok(())
    }

    /// The name of the key that encrypts now.
    pub fn current_key_name(&self) -> [u8; KEY_NAME_LEN] {
        self.rotate_if_due();
        self.read().current.name
    }

    /// How long the encrypting key has been in use.
    pub fn key_age(&self) -> Duration {
        self.rotate_if_due();
        let since = self.read().current.since;
        (self.clock)().duration_since(since).unwrap_or_default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Rotates when the period is over (cheap when it is not: one read lock).
    fn rotate_if_due(&self) {
        let now = (self.clock)();
        match self.read().switch_at {
            Some(t) if now >= t => {}
            _ => return,
        }
        let mut guard = self.state.write().unwrap_or_else(|e| e.into_inner());
        let st = &mut *guard;
        // bounded: every turn moves `switch_at` a period further, and after two turns
        // nothing encrypted before is left to keep
        for _ in 0..2 {
            let Some(at) = st.switch_at else { return };
            if now < at {
                return;
            }
            let fresh = match (&st.mode, st.next.take()) {
                (Mode::Fleet, Some(next)) => Ok(next),
                (Mode::Fleet, None) => {
                    // the fleet's last known key has had its period: it only decrypts from
                    // now on, for one more period; without a newer fleet key, local ones
                    // (at the fleet's period, so that key retires on time)
                    tracing::warn!(
                        "ticket keys: no newer key from the key server; local keys until it answers (tickets resume on this node only)"
                    );
                    st.mode = Mode::Local;
                    local_key(at)
                }
                (Mode::Local, _) => local_key(at),
                (Mode::Fixed, _) => {
                    // fixed keys do not rotate
                    st.switch_at = None;
                    return;
                }
            };
            let Ok(mut fresh) = fresh else {
                // no random key (the system's generator failed): the previous key has had
                // its two periods; the current one encrypts on and this is tried again at
                // the next ticket
                st.older.clear();
                return;
            };
            fresh.since = at;
            let old = std::mem::replace(&mut st.current, fresh);
            st.older = vec![old];
            st.switch_at = Some(at + st.period);
        }
        match st.switch_at {
            Some(at) if now >= at => {}
            _ => return,
        }
        // more than two periods passed: nothing encrypted before is kept
        st.older.clear();
        if let Ok(k) = local_key(now) {
            st.current = k;
            st.mode = Mode::Local;
            st.switch_at = Some(now + st.period);
        }
    }

    /// How many keys decrypt now (current, previous, a fleet's next).
    #[cfg(test)]
    fn held(&self) -> usize {
        let st = self.read();
        1 + st.older.len() + st.next.iter().count()
    }
}

/// A new random key that starts encrypting at `since`.
fn local_key(since: SystemTime) -> Result<Key, TicketError> {
    TicketKeyMaterial::random().and_then(|m| Key::new(&m, since))
}

impl ProducesTickets for Ticketer {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        // one period on the encrypting key, one more as the previous key
        let secs = self
            .rotation
            .as_secs()
            .saturating_mul(2)
            .min(MAX_LIFETIME_SECS);
        u32::try_from(secs).unwrap_or(u32::MAX)
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.rotate_if_due();
        self.read().current.seal(plain)
    }

    fn decrypt(&self, ticket: &[u8]) -> Option<Vec<u8>> {
        if ticket.len() < KEY_NAME_LEN + NONCE_LEN + TAG_LEN || ticket.len() > MAX_TICKET {
            return None;
        }
        self.rotate_if_due();
        let (name, rest) = ticket.split_at(KEY_NAME_LEN);
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let st = self.read();
        let key = std::iter::once(&st.current)
            .chain(st.older.iter())
            .chain(st.next.iter())
            .find(|k| k.name[..] == *name)?;
        key.open(nonce, sealed)
    }
}

/// Lower-case hex of bytes (key names in logs).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
