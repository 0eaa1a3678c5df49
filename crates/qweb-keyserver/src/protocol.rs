//! The key server wire protocol (see docs/KEYSERVER_PROTOCOL.md).
//!
//! Every frame: `u32 length` (big-endian, of everything after it, at most
//! [`MAX_FRAME`]) then `u8 version` (2), `u8 kind`, `u64 request id`, and a body by kind:
//! - request (1): `u8 opcode`, `[u8; 32] key id`, then the message to sign (the rest);
//! - response (2): the signature (the rest);
//! - error (3): `u8 error code`, then a UTF-8 message (the rest, may be empty);
//! - ticket keys request (4, version 2): empty;
//! - ticket keys (5, version 2): `u32 rotation`, `u32 next in`, `u32 current age` (seconds),
//!   `u8 has previous`, then 48-byte keys (`[u8; 16] name`, `[u8; 32] secret`): the
//!   previous (when present), the current, the next;
//! - generate key (6): `u8 algorithm` (1: ECDSA P-256), then a UTF-8 label (the rest);
//! - key generated (7): `[u8; 32] key id`, then the public key's SubjectPublicKeyInfo DER.
//!
//! The decoder never allocates more than `MAX_FRAME` for a frame and rejects anything
//! malformed with an error, never a panic.

use bytes::{Buf, BufMut, BytesMut};
use qweb_offload::{KeyId, SignScheme};
use qweb_tls::ticket::{KEY_NAME_LEN, KEY_SECRET_LEN};
use qweb_tls::{FleetKeys, TicketKeyMaterial};
use zeroize::Zeroize;

/// Protocol version (2 added the ticket key messages).
pub const VERSION: u8 = 2;
/// Largest frame (after the length prefix).
pub const MAX_FRAME: usize = 16 * 1024;
/// Bytes of a frame header after the length: version, kind, request id.
const HEADER: usize = 1 + 1 + 8;

/// Operation codes.
pub fn opcode(s: SignScheme) -> u8 {
    match s {
        SignScheme::RsaPkcs1Sha256 => 0x01,
        SignScheme::RsaPkcs1Sha384 => 0x02,
        SignScheme::RsaPkcs1Sha512 => 0x03,
        SignScheme::RsaPssSha256 => 0x04,
        SignScheme::RsaPssSha384 => 0x05,
        SignScheme::RsaPssSha512 => 0x06,
        SignScheme::EcdsaP256Sha256 => 0x07,
        SignScheme::EcdsaP384Sha384 => 0x08,
    }
}

/// The scheme of an opcode.
pub fn scheme(op: u8) -> Option<SignScheme> {
    Some(match op {
        0x01 => SignScheme::RsaPkcs1Sha256,
        0x02 => SignScheme::RsaPkcs1Sha384,
        0x03 => SignScheme::RsaPkcs1Sha512,
        0x04 => SignScheme::RsaPssSha256,
        0x05 => SignScheme::RsaPssSha384,
        0x06 => SignScheme::RsaPssSha512,
        0x07 => SignScheme::EcdsaP256Sha256,
        0x08 => SignScheme::EcdsaP384Sha384,
        _ => return None,
    })
}

/// Error codes of an error response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
#[non_exhaustive]
pub enum ErrorCode {
    /// No key with that id.
    UnknownKey = 1,
    /// The request was malformed or the opcode does not fit the key.
    BadRequest = 2,
    /// The signature failed.
    Internal = 3,
    /// The server's queue is full: retry elsewhere or later.
    Overloaded = 4,
}

impl ErrorCode {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => ErrorCode::UnknownKey,
            2 => ErrorCode::BadRequest,
            3 => ErrorCode::Internal,
            4 => ErrorCode::Overloaded,
            _ => return None,
        })
    }
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Sign `message` with key `key` under `scheme`.
    Request {
        /// Chosen by the client; echoed in the answer.
        id: u64,
        /// The scheme.
        scheme: SignScheme,
        /// The key.
        key: KeyId,
        /// The message.
        message: Vec<u8>,
    },
    /// The signature for request `id`.
    Response {
        /// The request.
        id: u64,
        /// The signature.
        signature: Vec<u8>,
    },
    /// Request `id` failed.
    Error {
        /// The request.
        id: u64,
        /// Why.
        code: ErrorCode,
        /// Details.
        message: String,
    },
    /// Asks for the fleet's session ticket keys.
    TicketKeysRequest {
        /// Chosen by the client; echoed in the answer.
        id: u64,
    },
    /// The fleet's session ticket keys.
    TicketKeys {
        /// The request.
        id: u64,
        /// Previous, current and next key, and the rotation times (whole seconds).
        keys: FleetKeys,
    },
    /// Asks the key server to generate an ECDSA P-256 key and keep it (for a certificate
    /// ordered by ACME: the private key never leaves the key server).
    GenerateKey {
        /// Chosen by the client; echoed in the answer.
        id: u64,
        /// Names the key in the key server's files (the certificate's first name).
        label: String,
    },
    /// The key generated: its id (SHA-256 of `spki`) and public key.
    KeyGenerated {
        /// The request.
        id: u64,
        /// The key's id.
        key: KeyId,
        /// SubjectPublicKeyInfo DER.
        spki: Vec<u8>,
    },
}

/// The one algorithm of [`Frame::GenerateKey`]: ECDSA P-256.
const GENERATE_P256: u8 = 1;

/// Bytes of one ticket key on the wire.
const TICKET_KEY: usize = KEY_NAME_LEN + KEY_SECRET_LEN;

/// Why bytes could not be decoded. Any of these closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The length prefix exceeds [`MAX_FRAME`] or is shorter than a header.
    #[error("bad frame length {0}")]
    Length(usize),
    /// Unsupported protocol version.
    #[error("unsupported protocol version {0}")]
    Version(u8),
    /// Unknown frame kind.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// Unknown opcode.
    #[error("unknown opcode {0}")]
    Opcode(u8),
    /// Unknown error code.
    #[error("unknown error code {0}")]
    ErrorCode(u8),
    /// A body too short for its kind.
    #[error("truncated {0} frame")]
    Truncated(&'static str),
}

impl Frame {
    /// The request id.
    pub fn id(&self) -> u64 {
        match self {
            Frame::Request { id, .. }
            | Frame::Response { id, .. }
            | Frame::Error { id, .. }
            | Frame::TicketKeysRequest { id }
            | Frame::TicketKeys { id, .. }
            | Frame::GenerateKey { id, .. }
            | Frame::KeyGenerated { id, .. } => *id,
        }
    }

    /// Appends the encoded frame to `out`. Panics never; a body larger than the limit is
    /// the caller's bug and is truncated to the limit (requests and signatures are tiny).
    pub fn encode(&self, out: &mut BytesMut) {
        let mut body = BytesMut::new();
        let (kind, id) = match self {
            Frame::Request {
                id,
                scheme,
                key,
                message,
            } => {
                body.put_u8(opcode(*scheme));
                body.put_slice(&key.0);
                body.put_slice(message);
                (1u8, *id)
            }
            Frame::Response { id, signature } => {
                body.put_slice(signature);
                (2, *id)
            }
            Frame::Error { id, code, message } => {
                body.put_u8(*code as u8);
                body.put_slice(message.as_bytes());
                (3, *id)
            }
            Frame::TicketKeysRequest { id } => (4, *id),
            Frame::TicketKeys { id, keys } => {
                let secs = |d: std::time::Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
                body.put_u32(secs(keys.rotation));
                body.put_u32(secs(keys.next_in));
                body.put_u32(secs(keys.current_age));
                body.put_u8(u8::from(keys.previous.is_some()));
                for k in keys.previous.iter().chain([&keys.current, &keys.next]) {
                    body.put_slice(&k.name);
                    // the key server makes 32-byte secrets; anything else is cut or padded
                    let mut secret = zeroize::Zeroizing::new([0u8; KEY_SECRET_LEN]);
                    let n = k.secret.len().min(KEY_SECRET_LEN);
                    secret[..n].copy_from_slice(&k.secret[..n]);
                    body.put_slice(&secret[..]);
                }
                (5, *id)
            }
            Frame::GenerateKey { id, label } => {
                body.put_u8(GENERATE_P256);
                body.put_slice(label.as_bytes());
                (6, *id)
            }
            Frame::KeyGenerated { id, key, spki } => {
                body.put_slice(&key.0);
                body.put_slice(spki);
                (7, *id)
            }
        };
        body.truncate(MAX_FRAME - HEADER);
        out.put_u32((HEADER + body.len()) as u32);
        out.put_u8(VERSION);
        out.put_u8(kind);
        out.put_u64(id);
        out.put_slice(&body);
        if kind == 5 {
            // ticket keys: the copy in `out` is the caller's to wipe once sent
            body[..].zeroize();
        }
    }

    /// Decodes one frame from the front of `buf` when it is complete (consuming it);
    /// `Ok(None)` when more bytes are needed.
    pub fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, ProtocolError> {
        if buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if !(HEADER..=MAX_FRAME).contains(&len) {
            return Err(ProtocolError::Length(len));
        }
        if buf.len() < 4 + len {
            // bounded: the caller never needs to hold more than 4 + MAX_FRAME bytes
            buf.reserve(4 + len - buf.len());
            return Ok(None);
        }
        buf.advance(4);
        let mut f = buf.split_to(len);
        let version = f.get_u8();
        if version != VERSION {
            return Err(ProtocolError::Version(version));
        }
        let kind = f.get_u8();
        let id = f.get_u64();
        let frame = match kind {
            1 => {
                if f.len() < 1 + 32 {
                    return Err(ProtocolError::Truncated("request"));
                }
                let op = f.get_u8();
                let scheme = scheme(op).ok_or(ProtocolError::Opcode(op))?;
                let mut key = [0u8; 32];
                f.copy_to_slice(&mut key);
                Frame::Request {
                    id,
                    scheme,
                    key: KeyId(key),
                    message: f.to_vec(),
                }
            }
            2 => Frame::Response {
                id,
                signature: f.to_vec(),
            },
            3 => {
                if f.is_empty() {
                    return Err(ProtocolError::Truncated("error"));
                }
                let c = f.get_u8();
                let code = ErrorCode::from_u8(c).ok_or(ProtocolError::ErrorCode(c))?;
                Frame::Error {
                    id,
                    code,
                    message: String::from_utf8_lossy(&f).into_owned(),
                }
            }
            4 => Frame::TicketKeysRequest { id },
            5 => {
                // ticket keys: parsed from a view, then the frame's bytes are wiped (error
                // or not)
                let keys = decode_ticket_keys(&f);
                f[..].zeroize();
                Frame::TicketKeys { id, keys: keys? }
            }
            6 => {
                if f.is_empty() {
                    return Err(ProtocolError::Truncated("generate key"));
                }
                let alg = f.get_u8();
                if alg != GENERATE_P256 {
                    return Err(ProtocolError::Opcode(alg));
                }
                Frame::GenerateKey {
                    id,
                    label: String::from_utf8_lossy(&f).into_owned(),
                }
            }
            7 => {
                if f.len() <= 32 {
                    return Err(ProtocolError::Truncated("key generated"));
                }
                let mut key = [0u8; 32];
                f.copy_to_slice(&mut key);
                Frame::KeyGenerated {
                    id,
                    key: KeyId(key),
                    spki: f.to_vec(),
                }
            }
            k => return Err(ProtocolError::Kind(k)),
        };
        Ok(Some(frame))
    }
}

fn decode_ticket_keys(mut f: &[u8]) -> Result<FleetKeys, ProtocolError> {
    const FIXED: usize = 4 + 4 + 4 + 1;
    if f.len() < FIXED {
        return Err(ProtocolError::Truncated("ticket keys"));
    }
    let secs = |v: u32| std::time::Duration::from_secs(u64::from(v));
    let rotation = secs(f.get_u32());
    let next_in = secs(f.get_u32());
    let current_age = secs(f.get_u32());
    let has_previous = match f.get_u8() {
        0 => false,
        1 => true,
        _ => return Err(ProtocolError::Truncated("ticket keys")),
    };
    let count = 2 + usize::from(has_previous);
    if f.len() != count * TICKET_KEY {
        return Err(ProtocolError::Truncated("ticket keys"));
    }
    let mut take = || {
        let mut name = [0u8; KEY_NAME_LEN];
        f.copy_to_slice(&mut name);
        let (secret, rest) = f.split_at(KEY_SECRET_LEN);
        f = rest;
        TicketKeyMaterial {
            name,
            secret: secret.to_vec(),
        }
    };
    let previous = has_previous.then(&mut take);
    let current = take();
    let next = take();
    Ok(FleetKeys {
        previous,
        current,
        next,
        next_in,
        current_age,
        rotation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(f: Frame) {
        let mut b = BytesMut::new();
        f.encode(&mut b);
        // byte by byte: incomplete until the last byte
        let mut partial = BytesMut::new();
        let bytes = b.to_vec();
        for (i, byte) in bytes.iter().enumerate() {
            partial.put_u8(*byte);
            let r = Frame::decode(&mut partial).unwrap();
            if i + 1 < bytes.len() {
                assert!(r.is_none());
            } else {
                assert_eq!(r, Some(f.clone()));
                assert!(partial.is_empty());
            }
        }
    }

    #[test]
    fn frames_roundtrip() {
        roundtrip(Frame::Request {
            id: 7,
            scheme: SignScheme::RsaPssSha256,
            key: KeyId([9; 32]),
            message: b"to be signed".to_vec(),
        });
        roundtrip(Frame::Response {
            id: u64::MAX,
            signature: vec![1, 2, 3],
        });
        roundtrip(Frame::Error {
            id: 0,
            code: ErrorCode::Overloaded,
            message: "busy".into(),
        });
        roundtrip(Frame::TicketKeysRequest { id: 5 });
        let k = |b: u8| TicketKeyMaterial {
            name: [b; 16],
            secret: vec![b; 32],
        };
        for previous in [None, Some(k(1))] {
            roundtrip(Frame::TicketKeys {
                id: 6,
                keys: FleetKeys {
                    previous,
                    current: k(2),
                    next: k(3),
                    next_in: std::time::Duration::from_secs(10),
                    current_age: std::time::Duration::from_secs(20),
                    rotation: std::time::Duration::from_secs(30),
                },
            });
        }
        roundtrip(Frame::GenerateKey {
            id: 8,
            label: "a.example".into(),
        });
        roundtrip(Frame::KeyGenerated {
            id: 9,
            key: KeyId([4; 32]),
            spki: vec![0x30, 0x59, 1, 2],
        });
        for op in 1..=8 {
            assert_eq!(opcode(scheme(op).unwrap()), op);
        }
        // an unknown algorithm, an empty generate body, an answer without a key
        let mut b = BytesMut::new();
        b.put_u32(HEADER as u32 + 1);
        b.put_slice(&[VERSION, 6, 0, 0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(Frame::decode(&mut b), Err(ProtocolError::Opcode(2)));
        let mut b = BytesMut::new();
        b.put_u32(HEADER as u32);
        b.put_slice(&[VERSION, 6, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert!(matches!(
            Frame::decode(&mut b),
            Err(ProtocolError::Truncated(_))
        ));
        let mut b = BytesMut::new();
        b.put_u32(HEADER as u32 + 32);
        b.put_slice(&[VERSION, 7, 0, 0, 0, 0, 0, 0, 0, 1]);
        b.put_slice(&[0; 32]);
        assert!(matches!(
            Frame::decode(&mut b),
            Err(ProtocolError::Truncated(_))
        ));
    }

    #[test]
    fn malformed_frames_are_errors() {
        let cases: &[(&[u8], ProtocolError)] = &[
            (
                &[0xff, 0xff, 0xff, 0xff],
                ProtocolError::Length(0xffff_ffff),
            ),
            (&[0, 0, 0, 2, 1, 1], ProtocolError::Length(2)),
            (
                &[0, 0, 0, 10, 9, 1, 0, 0, 0, 0, 0, 0, 0, 0],
                ProtocolError::Version(9),
            ),
            (
                &[0, 0, 0, 10, 2, 9, 0, 0, 0, 0, 0, 0, 0, 0],
                ProtocolError::Kind(9),
            ),
            (
                &[0, 0, 0, 11, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                ProtocolError::Truncated("request"),
            ),
            (
                &[0, 0, 0, 10, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0],
                ProtocolError::Truncated("error"),
            ),
            (
                &[0, 0, 0, 11, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 99],
                ProtocolError::ErrorCode(99),
            ),
            // version 1 peers are refused (the ticket messages need both ends at 2)
            (
                &[0, 0, 0, 10, 1, 4, 0, 0, 0, 0, 0, 0, 0, 0],
                ProtocolError::Version(1),
            ),
            // ticket keys: too short
            (
                &[0, 0, 0, 11, 2, 5, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                ProtocolError::Truncated("ticket keys"),
            ),
        ];
        for (bytes, want) in cases {
            let mut b = BytesMut::from(*bytes);
            assert_eq!(Frame::decode(&mut b), Err(want.clone()), "{bytes:?}");
        }
        let mut req = BytesMut::new();
        req.put_u32(HEADER as u32 + 33);
        req.put_u8(VERSION);
        req.put_u8(1);
        req.put_u64(1);
        req.put_u8(0x42);
        req.put_slice(&[0; 32]);
        assert_eq!(Frame::decode(&mut req), Err(ProtocolError::Opcode(0x42)));
        // ticket keys: a bad flag, keys missing or extra
        for (flag, keys) in [(2u8, 2usize), (0, 1), (0, 3), (1, 2)] {
            let mut f = BytesMut::new();
            f.put_u32((HEADER + 13 + keys * TICKET_KEY) as u32);
            f.put_u8(VERSION);
            f.put_u8(5);
            f.put_u64(1);
            f.put_slice(&[0; 12]);
            f.put_u8(flag);
            f.put_slice(&vec![0; keys * TICKET_KEY]);
            assert_eq!(
                Frame::decode(&mut f),
                Err(ProtocolError::Truncated("ticket keys")),
                "flag {flag}, {keys} keys"
            );
        }
    }

    /// Property: any byte string decodes to frames or an error, never a panic, and never
    /// makes the buffer grow past one maximal frame.
    #[test]
    fn random_bytes_never_panic() {
        let mut seed: u64 = 0x1234_5678_9abc_def1;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..20_000 {
            let len = (next() % 64) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if round % 2 == 0 && bytes.len() >= 6 {
                // plausible headers reach the body decoding
                let l = (bytes.len() - 4) as u32;
                bytes[..4].copy_from_slice(&l.to_be_bytes());
                bytes[4] = VERSION;
                bytes[5] = (next() % 6) as u8;
            }
            let mut b = BytesMut::from(&bytes[..]);
            while let Ok(Some(_)) = Frame::decode(&mut b) {}
            assert!(
                b.capacity() <= 4 + MAX_FRAME + 64,
                "buffer grew to {}",
                b.capacity()
            );
        }
    }
}
