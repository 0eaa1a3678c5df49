//! `ticket_keys = "fleet"`: the listener's ticket keys from the fleet's store (Redis).
//!
//! The ring (previous, current and next key, and when the current one started encrypting,
//! in the store's own clock: `TIME`) is one value, `{prefix}tickets:{rotation in ms}`, so
//! that the listeners of every node with the same `ticket_rotation` share it. It is sealed
//! with AES-256-GCM under a key derived from `fleet.secret` (HKDF-SHA256, salt
//! [`SEAL_SALT`]), a random nonce per value, the value's key name as additional data (a
//! value moved under another key does not open). Layout: `nonce (12) || sealed || tag (16)`;
//! inside, `version (1) || has previous (1) || since, µs of the store's TIME (8, BE) ||
//! keys`, each key `name (16) || secret (32)`.
//!
//! Each node's refresher (the key-server refresher's loop, `qweb_keyserver::tickets`, on a
//! thread of its own: never a worker's event loop) reads `TIME` and the ring; when the ring
//! is missing or a period old, it takes `{ring}:lock` (`SET NX PX`, so a node that dies
//! holding it loses it, and no node's clock decides anything), reads again, rotates
//! ([`qweb_tls::FleetKeys::advance`], the key server's rotation), writes, and releases the
//! lock if it still holds it. A value that does not open (another secret, tampered bytes)
//! is refused, counted and left alone: this node keeps the keys it has, which retire by age
//! as they do when the key server is away.

use std::time::Duration;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use aws_lc_rs::hkdf;
use qweb_tls::{FleetKeys, TicketKeyMaterial};
use redis::aio::MultiplexedConnection;
use zeroize::Zeroizing;

/// HKDF salt of the store's sealing key.
pub(crate) const SEAL_SALT: &[u8] = b"qweb fleet seal v1";
/// HKDF info of the ticket keys' sealing key.
const TICKETS_INFO: &[u8] = b"qweb fleet ticket keys";
/// HKDF info of ACME's sealing key (account and certificate keys).
const ACME_INFO: &[u8] = b"qweb fleet acme keys";
const VERSION: u8 = 1;
const KEY_LEN: usize = qweb_tls::ticket::KEY_NAME_LEN + qweb_tls::ticket::KEY_SECRET_LEN;
const HEADER: usize = 2 + 8;
/// Deletes `KEYS[1]` only while it holds `ARGV[1]` (a lock's release by its holder only:
/// it may have expired and been taken by another node).
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// Takes the lock `key` for `token` unless another holds it: `SET key token NX PX ttl_ms`
/// (answers `OK`, or nil while held). The store's time to live ends a lock whose holder
/// died; no node's clock decides.
pub(crate) fn take_lock(key: &str, token: &str, ttl_ms: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(key).arg(token).arg("NX").arg("PX").arg(ttl_ms);
    cmd
}

/// Releases the lock `key` if `token` still holds it (answers 1, else 0).
pub(crate) fn release_lock(key: &str, token: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(RELEASE).arg(1).arg(key).arg(token);
    cmd
}
/// How long a rotation lock lives when its holder does not release it.
const LOCK_TTL_MS: u64 = 10_000;

/// Why the ring could not be had.
#[derive(Debug)]
#[non_exhaustive]
pub(crate) enum RingError {
    /// The store did not answer, or failed.
    Store(String),
    /// The value does not open with this node's secret (another secret, or tampered).
    Refused,
    /// No random bytes.
    Random,
}

impl std::fmt::Display for RingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RingError::Store(e) => write!(f, "the store: {e}"),
            RingError::Refused => f.write_str(
                "the ring in the store does not decrypt with this node's fleet.secret (another secret, or tampered with)",
            ),
            RingError::Random => f.write_str("no random bytes"),
        }
    }
}

/// The AEAD that seals values in the store, keyed from the fleet's secret.
pub(crate) struct Seal(LessSafeKey);

impl Seal {
    /// The sealing key of the ticket keys, from `secret` (`None`: aws-lc refused, which
    /// a 32-byte key never is).
    pub(crate) fn tickets(secret: &[u8]) -> Option<Seal> {
        Seal::derive(secret, TICKETS_INFO)
    }

    /// The sealing key of ACME's private keys in the store (`runtime::tls::acme::fleet`).
    pub(crate) fn acme(secret: &[u8]) -> Option<Seal> {
        Seal::derive(secret, ACME_INFO)
    }

    /// The sealing key for one use (`info`) of `secret`: each use has a key of its own.
    fn derive(secret: &[u8], info: &[u8]) -> Option<Seal> {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, SEAL_SALT).extract(secret);
        let mut key = Zeroizing::new([0u8; 32]);
        prk.expand(&[info], hkdf::HKDF_SHA256)
            .ok()?
            .fill(&mut key[..])
            .ok()?;
        let unbound = UnboundKey::new(&AES_256_GCM, &key[..]).ok()?;
        Some(Seal(LessSafeKey::new(unbound)))
    }

    /// `plain` sealed under the store key `name`.
    pub(crate) fn seal(&self, name: &str, plain: &[u8]) -> Result<Vec<u8>, RingError> {
        let mut nonce = [0u8; NONCE_LEN];
        aws_lc_rs::rand::fill(&mut nonce).map_err(|_| RingError::Random)?;
        let mut body = plain.to_vec();
        let n = Nonce::assume_unique_for_key(nonce);
        self.0
            .seal_in_place_append_tag(n, Aad::from(name.as_bytes()), &mut body)
            .map_err(|_| RingError::Random)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&body);
        use zeroize::Zeroize;
        body.zeroize();
        Ok(out)
    }

    /// The plain bytes of `value` read under `name`, or [`RingError::Refused`].
    pub(crate) fn open(&self, name: &str, value: &[u8]) -> Result<Zeroizing<Vec<u8>>, RingError> {
        let (nonce, sealed) = value
            .split_at_checked(NONCE_LEN)
            .ok_or(RingError::Refused)?;
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| RingError::Refused)?;
        let mut body = Zeroizing::new(sealed.to_vec());
        let n = self
            .0
            .open_in_place(nonce, Aad::from(name.as_bytes()), &mut body)
            .map_err(|_| RingError::Refused)?
            .len();
        body.truncate(n);
        Ok(body)
    }
}

/// The ring as stored: the keys and when the current one started (µs of the store's TIME).
struct Stored {
    keys: FleetKeys,
    since_us: u64,
}

fn encode(ring: &Stored) -> Zeroizing<Vec<u8>> {
    let k = &ring.keys;
    let mut out = Zeroizing::new(Vec::with_capacity(HEADER + 3 * KEY_LEN));
    out.push(VERSION);
    out.push(u8::from(k.previous.is_some()));
    out.extend_from_slice(&ring.since_us.to_be_bytes());
    for key in k.previous.iter().chain([&k.current, &k.next]) {
        out.extend_from_slice(&key.name);
        out.extend_from_slice(&key.secret);
    }
    out
}

fn decode(plain: &[u8], rotation: Duration) -> Result<Stored, RingError> {
    let (head, rest) = plain.split_at_checked(HEADER).ok_or(RingError::Refused)?;
    let has_previous = match (head[0], head[1]) {
        (VERSION, 0) => false,
        (VERSION, 1) => true,
        _ => return Err(RingError::Refused),
    };
    let mut since = [0u8; 8];
    since.copy_from_slice(&head[2..]);
    let count = 2 + usize::from(has_previous);
    if rest.len() != count * KEY_LEN {
        return Err(RingError::Refused);
    }
    let mut keys = rest.chunks_exact(KEY_LEN).map(|c| {
        let (n, s) = c.split_at(qweb_tls::ticket::KEY_NAME_LEN);
        let mut name = [0u8; qweb_tls::ticket::KEY_NAME_LEN];
        name.copy_from_slice(n);
        TicketKeyMaterial {
            name,
            secret: s.to_vec(),
        }
    });
    let previous = if has_previous { keys.next() } else { None };
    let (Some(current), Some(next)) = (keys.next(), keys.next()) else {
        return Err(RingError::Refused);
    };
    Ok(Stored {
        keys: FleetKeys {
            previous,
            current,
            next,
            next_in: rotation,
            current_age: Duration::ZERO,
            rotation,
        },
        since_us: u64::from_be_bytes(since),
    })
}

/// A listener's ring in the fleet's store, as a key source of the refresher.
pub(crate) struct FleetRing {
    client: redis::Client,
    conn: Option<MultiplexedConnection>,
    timeout: Duration,
    seal: Seal,
    key: String,
    lock: String,
    token: String,
    rotation: Duration,
    stats: std::sync::Arc<qweb_keyserver::tickets::FetchStats>,
}

impl FleetRing {
    /// The ring of listeners rotating every `rotation` in `fleet`'s store; `None` without a
    /// usable store URL or secret (the configuration refuses both before).
    pub(crate) fn new(
        fleet: &qweb_config::FleetConfig,
        rotation: Duration,
        stats: std::sync::Arc<qweb_keyserver::tickets::FetchStats>,
    ) -> Option<FleetRing> {
        let secret = fleet.secret.as_ref()?;
        let client = redis::Client::open(fleet.store.as_str()).ok()?;
        if fleet.store.starts_with("rediss://") {
            let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        }
        let key = format!("{}tickets:{}", fleet.key_prefix, rotation.as_millis());
        Some(FleetRing {
            client,
            conn: None,
            timeout: fleet.timeout,
            seal: Seal::tickets(secret.bytes())?,
            lock: format!("{key}:lock"),
            key,
            token: format!("{}:{}", fleet.node_name, std::process::id()),
            rotation,
            stats,
        })
    }

    /// Drops the connection (made on another runtime): the next fetch connects again.
    pub(crate) fn disconnect(&mut self) {
        self.conn = None;
    }

    async fn conn(&mut self) -> Result<MultiplexedConnection, RingError> {
        if let Some(c) = &self.conn {
            return Ok(c.clone());
        }
        let cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(self.timeout)
            .set_response_timeout(self.timeout);
        let c = self.bounded(
            self.client
                .get_multiplexed_async_connection_with_config(&cfg),
        );
        let c = c.await?;
        self.conn = Some(c.clone());
        Ok(c)
    }

    async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, RingError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(RingError::Store(e.to_string())),
            Err(_) => Err(RingError::Store(format!(
                "no answer within {:?}",
                self.timeout
            ))),
        }
    }

    /// The store's clock (µs) and the ring, opened and aged to that clock (`None`: none).
    async fn read(&mut self) -> Result<(u64, Option<Stored>), RingError> {
        let mut c = self.conn().await?;
        let (time, value): ((u64, u64), Option<Vec<u8>>) = self
            .bounded(
                redis::pipe()
                    .cmd("TIME")
                    .cmd("GET")
                    .arg(&self.key)
                    .query_async(&mut c),
            )
            .await?;
        let now_us = time.0.saturating_mul(1_000_000).saturating_add(time.1);
        let Some(value) = value else {
            return Ok((now_us, None));
        };
        let plain = self.seal.open(&self.key, &value)?;
        let mut ring = decode(&plain, self.rotation)?;
        ring.keys.current_age = Duration::from_micros(now_us.saturating_sub(ring.since_us));
        Ok((now_us, Some(ring)))
    }

    async fn fetch_inner(&mut self) -> Result<FleetKeys, RingError> {
        let (_, ring) = self.read().await?;
        if let Some(r) = &ring {
            if r.keys.current_age < self.rotation {
                let mut keys = r.keys.clone();
                keys.advance().map_err(|_| RingError::Random)?;
                return Ok(keys);
            }
        }
        // missing or a period old: rotate, if this node gets the lock
        let mut c = self.conn().await?;
        let got: Option<String> = self
            .bounded(take_lock(&self.lock, &self.token, LOCK_TTL_MS).query_async(&mut c))
            .await?;
        if got.is_none() {
            // another node rotates: its keys are read next time; these meanwhile, not
            // rotated here (their next key takes over now; the one after is not known)
            return match ring {
                Some(r) if r.keys.current_age < 2 * self.rotation => {
                    let mut keys = r.keys;
                    keys.next_in = Duration::ZERO;
                    Ok(keys)
                }
                _ => Err(RingError::Store(
                    "the ring is being made by another node".into(),
                )),
            };
        }
        let result = self.rotate().await;
        // released only if still this node's (it may have expired and been taken)
        let _ = self
            .bounded(release_lock(&self.lock, &self.token).query_async::<i64>(&mut c))
            .await;
        result
    }

    /// Under the lock: reads again, rotates, writes.
    async fn rotate(&mut self) -> Result<FleetKeys, RingError> {
        let (now_us, ring) = self.read().await?;
        let mut keys = match ring {
            Some(r) => r.keys,
            None => FleetKeys::random(self.rotation).map_err(|_| RingError::Random)?,
        };
        keys.advance().map_err(|_| RingError::Random)?;
        let age_us = u64::try_from(keys.current_age.as_micros()).unwrap_or(u64::MAX);
        let stored = Stored {
            keys,
            since_us: now_us.saturating_sub(age_us),
        };
        let value = self.seal.seal(&self.key, &encode(&stored))?;
        // the ring outlives its keys' use by a margin, then goes
        let ttl = u64::try_from((self.rotation * 4).as_millis()).unwrap_or(u64::MAX);
        let mut c = self.conn().await?;
        self.bounded(
            redis::cmd("SET")
                .arg(&self.key)
                .arg(value)
                .arg("PX")
                .arg(ttl)
                .query_async::<()>(&mut c),
        )
        .await?;
        tracing::info!(ring = %self.key, "ticket keys: the fleet's ring rotated by this node");
        Ok(stored.keys)
    }
}

impl qweb_keyserver::tickets::KeySource for FleetRing {
    const DOWN: &'static str = "no keys from the fleet's store";
    const BACK: &'static str = "the fleet's store gives keys again";
    async fn fetch(&mut self) -> Result<FleetKeys, String> {
        match self.fetch_inner().await {
            Ok(k) => Ok(k),
            Err(e) => {
                match e {
                    RingError::Refused => {
                        self.stats
                            .refused
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    RingError::Store(_) => self.conn = None,
                    RingError::Random => {}
                }
                Err(e.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_ring_opens_under_its_name_and_secret_only() {
        let seal = Seal::tickets(&[7u8; 32]).unwrap();
        let keys = FleetKeys::random(Duration::from_secs(60)).unwrap();
        let ring = Stored { keys, since_us: 42 };
        let v = seal.seal("qweb:tickets:60000", &encode(&ring)).unwrap();
        let plain = seal.open("qweb:tickets:60000", &v).unwrap();
        let back = decode(&plain, Duration::from_secs(60)).unwrap();
        assert_eq!((back.keys.current, back.since_us), (ring.keys.current, 42));
        assert!(matches!(
            seal.open("qweb:tickets:1000", &v),
            Err(RingError::Refused)
        ));
        let other = Seal::tickets(&[8u8; 32]).unwrap();
        assert!(matches!(
            other.open("qweb:tickets:60000", &v),
            Err(RingError::Refused)
        ));
        let mut bad = v.clone();
        bad[20] ^= 1;
        assert!(matches!(
            seal.open("qweb:tickets:60000", &bad),
            Err(RingError::Refused)
        ));
        for n in [0, 5, 12, 28] {
            assert!(seal.open("qweb:tickets:60000", &v[..n]).is_err());
        }
        assert!(decode(&[1, 2, 0, 0, 0, 0, 0, 0, 0, 0], Duration::from_secs(1)).is_err());
    }
}
