//! OCSP stapling: a DER OCSP response for a certificate, checked before it is stapled and
//! at every handshake.
//!
//! A response is stapled only when it is `successful`, holds a `SingleResponse` whose CertID
//! names this certificate (its serial number, and the hash of its issuer's name with the
//! CertID's hash algorithm, SHA-1 or SHA-256), says `good`, and is current: `thisUpdate` is
//! not in the future (5 minutes of clock skew allowed) and `nextUpdate` is present and not
//! past. The check is redone at each handshake, so a response is never stapled after its
//! `nextUpdate`, even if nothing replaced it. The responder's signature is left to the client
//! (which must verify it anyway). The DER reader is bounded and never panics on hostile
//! input.

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::sign::CertifiedKey;

use crate::der::{cert_parts, generalized_time, tbs_fields, Der, DerError, SEQ};

/// Why an OCSP response is not stapled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OcspError {
    /// Not DER, or not an OCSP response.
    #[error("malformed OCSP response: {0}")]
    Malformed(&'static str),
    /// The responder did not answer `successful`.
    #[error("OCSP response status {0} (not successful)")]
    Status(u8),
    /// No `SingleResponse` names this certificate.
    #[error("the OCSP response is for another certificate")]
    Mismatch,
    /// The certificate's status is not `good`.
    #[error("the OCSP response says the certificate is {0}")]
    NotGood(&'static str),
    /// `nextUpdate` is past (or absent).
    #[error("the OCSP response expired (nextUpdate passed or missing)")]
    Expired,
    /// `thisUpdate` is in the future.
    #[error("the OCSP response is not valid yet (thisUpdate in the future)")]
    NotYetValid,
    /// The certificate could not be parsed.
    #[error("cannot read the certificate: {0}")]
    Certificate(&'static str),
}

impl From<DerError> for OcspError {
    fn from(e: DerError) -> Self {
        match e {
            DerError::Certificate(m) => OcspError::Certificate(m),
            DerError::Malformed(m) => OcspError::Malformed(m),
        }
    }
}

const OID_BASIC: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x30, 0x01, 0x01];
const OID_SHA1: &[u8] = &[0x2b, 0x0e, 0x03, 0x02, 0x1a];
const OID_SHA256: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01];

/// What the stapler needs from the leaf certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LeafId {
    serial: Vec<u8>,
    /// The DER of the issuer Name.
    issuer: Vec<u8>,
}

fn leaf_id(cert: &[u8]) -> Result<LeafId, OcspError> {
    let c = OcspError::Certificate;
    let mut tbs = tbs_fields(cert)?;
    let serial = tbs
        .expect(0x02, "serial")
        .map_err(|_| c("no serial"))?
        .to_vec();
    tbs.expect(SEQ, "signature")
        .map_err(|_| c("no signature algorithm"))?;
    let (tag, _, whole) = tbs.next().map_err(|_| c("no issuer"))?;
    if tag != SEQ {
        return Err(c("no issuer"));
    }
    Ok(LeafId {
        serial,
        issuer: whole.to_vec(),
    })
}

const OID_AIA: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x01, 0x01];
const OID_AD_OCSP: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x30, 0x01];

/// The `http://` OCSP responder URL of a certificate (its Authority Information Access
/// extension), if it has one.
pub fn responder_url(cert: &[u8]) -> Result<Option<String>, OcspError> {
    let (_, _, ext) = cert_parts(cert)?;
    let Some(ext) = ext else { return Ok(None) };
    let c = OcspError::Certificate;
    let mut outer = Der(&ext);
    let mut list = Der(outer
        .expect(SEQ, "extensions")
        .map_err(|_| c("extensions"))?);
    while !list.is_empty() {
        let mut e = Der(list.expect(SEQ, "extension").map_err(|_| c("extension"))?);
        let oid = e.expect(0x06, "oid").map_err(|_| c("extension"))?;
        if e.peek_tag() == Some(0x01) {
            e.next().map_err(|_| c("extension"))?;
        }
        let value = e.expect(0x04, "value").map_err(|_| c("extension"))?;
        if oid != OID_AIA {
            continue;
        }
        let mut v = Der(value);
        let mut descs = Der(v.expect(SEQ, "aia").map_err(|_| c("authorityInfoAccess"))?);
        while !descs.is_empty() {
            let mut d = Der(descs
                .expect(SEQ, "ad")
                .map_err(|_| c("authorityInfoAccess"))?);
            let method = d
                .expect(0x06, "method")
                .map_err(|_| c("authorityInfoAccess"))?;
            let (tag, name, _) = d.next().map_err(|_| c("authorityInfoAccess"))?;
            if method == OID_AD_OCSP && tag == 0x86 {
                if let Ok(url) = std::str::from_utf8(name) {
                    if url.starts_with("http://") {
                        return Ok(Some(url.to_owned()));
                    }
                }
            }
        }
    }
    Ok(None)
}

/// A DER OCSP request (no nonce) for `cert` issued by `issuer`, with a SHA-1 CertID (what
/// responders support most widely).
pub fn request(cert: &[u8], issuer: &[u8]) -> Result<Vec<u8>, OcspError> {
    let leaf = leaf_id(cert)?;
    let (issuer_subject, issuer_key, _) = cert_parts(issuer)?;
    if issuer_subject != leaf.issuer {
        return Err(OcspError::Certificate(
            "the next certificate of the chain is not the leaf's issuer",
        ));
    }
    let sha1 = |b: &[u8]| {
        aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, b)
            .as_ref()
            .to_vec()
    };
    let alg = tlv(SEQ, &[tlv(0x06, OID_SHA1), vec![0x05, 0x00]].concat());
    let cert_id = tlv(
        SEQ,
        &[
            alg,
            tlv(0x04, &sha1(&leaf.issuer)),
            tlv(0x04, &sha1(&issuer_key)),
            tlv(0x02, &leaf.serial),
        ]
        .concat(),
    );
    let request = tlv(SEQ, &cert_id);
    let tbs = tlv(SEQ, &tlv(SEQ, &request));
    Ok(tlv(SEQ, &tbs))
}

/// DER: a tag, its length, its contents.
fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let n = content.len();
    if n < 0x80 {
        out.push(n as u8);
    } else {
        let bytes = n.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

/// What a usable response says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OcspStatus {
    /// `thisUpdate`.
    pub this_update: SystemTime,
    /// `nextUpdate`.
    pub next_update: SystemTime,
}

/// Skew allowed on `thisUpdate`.
const SKEW: Duration = Duration::from_secs(300);

/// Checks that `response` (DER) may be stapled for the leaf `cert` (DER) at `now`.
pub fn check_response(
    response: &[u8],
    cert: &[u8],
    now: SystemTime,
) -> Result<OcspStatus, OcspError> {
    let bad = OcspError::Malformed;
    let leaf = leaf_id(cert)?;
    let mut top = Der(response);
    let mut resp = Der(top.expect(SEQ, "OCSPResponse")?);
    let status = resp.expect(0x0a, "responseStatus")?;
    match status {
        [0] => {}
        [s] => return Err(OcspError::Status(*s)),
        _ => return Err(bad("responseStatus")),
    }
    let mut rb = Der(resp.expect(0xa0, "responseBytes")?);
    let mut rb = Der(rb.expect(SEQ, "responseBytes")?);
    if rb.expect(0x06, "responseType")? != OID_BASIC {
        return Err(bad("not a basic OCSP response"));
    }
    let mut basic = Der(rb.expect(0x04, "response")?);
    let mut basic = Der(basic.expect(SEQ, "BasicOCSPResponse")?);
    let mut data = Der(basic.expect(SEQ, "tbsResponseData")?);
    if data.peek_tag() == Some(0xa0) {
        data.next()?; // version
    }
    data.next()?; // responderID
    data.expect(0x18, "producedAt")?;
    let mut responses = Der(data.expect(SEQ, "responses")?);
    while !responses.is_empty() {
        let mut single = Der(responses.expect(SEQ, "SingleResponse")?);
        let mut cert_id = Der(single.expect(SEQ, "CertID")?);
        let mut alg = Der(cert_id.expect(SEQ, "hashAlgorithm")?);
        let oid = alg.expect(0x06, "hash OID")?;
        let name_hash = cert_id.expect(0x04, "issuerNameHash")?;
        cert_id.expect(0x04, "issuerKeyHash")?;
        let serial = cert_id.expect(0x02, "serialNumber")?;
        let want_hash = match oid {
            OID_SHA1 => aws_lc_rs::digest::digest(
                &aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY,
                &leaf.issuer,
            ),
            OID_SHA256 => aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &leaf.issuer),
            _ => continue,
        };
        if serial != leaf.serial.as_slice() || name_hash != want_hash.as_ref() {
            continue;
        }
        let (tag, _, _) = single.next()?;
        match tag {
            0x80 => {}
            0xa1 => return Err(OcspError::NotGood("revoked")),
            0x82 => return Err(OcspError::NotGood("unknown")),
            _ => return Err(bad("certStatus")),
        }
        let this_update = generalized_time(single.expect(0x18, "thisUpdate")?)?;
        let next_update = match single.peek_tag() {
            Some(0xa0) => {
                let mut n = Der(single.expect(0xa0, "nextUpdate")?);
                generalized_time(n.expect(0x18, "nextUpdate")?)?
            }
            _ => return Err(OcspError::Expired),
        };
        if this_update > now + SKEW {
            return Err(OcspError::NotYetValid);
        }
        if next_update <= now {
            return Err(OcspError::Expired);
        }
        return Ok(OcspStatus {
            this_update,
            next_update,
        });
    }
    Err(OcspError::Mismatch)
}

/// The staple of one certificate: replaced by the loader or fetcher, checked for time at
/// every handshake.
#[derive(Debug)]
pub struct OcspStaple {
    /// The certificate without a staple.
    plain: Arc<CertifiedKey>,
    current: RwLock<Option<(Arc<CertifiedKey>, OcspStatus)>>,
    /// Responses refused (unreadable, malformed, expired, for another certificate).
    pub failures: std::sync::atomic::AtomicU64,
}

impl OcspStaple {
    /// A staple holder for `plain` (which must have no `ocsp` of its own), empty.
    pub fn new(plain: Arc<CertifiedKey>) -> Self {
        OcspStaple {
            plain,
            current: RwLock::new(None),
            failures: Default::default(),
        }
    }

    /// Checks `response` and staples it from now on; on error the previous staple stays
    /// (until its own `nextUpdate`).
    pub fn set(&self, response: Vec<u8>, now: SystemTime) -> Result<OcspStatus, OcspError> {
        let leaf = self
            .plain
            .cert
            .first()
            .ok_or(OcspError::Certificate("no certificate"))?;
        let status = check_response(&response, leaf.as_ref(), now).inspect_err(|_| {
            self.failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        })?;
        let mut stapled = (*self.plain).clone();
        stapled.ocsp = Some(response);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) =
            Some((Arc::new(stapled), status.clone()));
        Ok(status)
    }

    /// The leaf certificate (DER) and the next one of its chain (its issuer, if present).
    pub fn chain(&self) -> (&[u8], Option<&[u8]>) {
        let leaf = self.plain.cert.first().map(|c| c.as_ref()).unwrap_or(&[]);
        (leaf, self.plain.cert.get(1).map(|c| c.as_ref()))
    }

    /// Counts a failure to get a response (responder unreachable, bad answer).
    pub fn failed(&self) {
        self.failures
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The certificate to serve at `now`: with the staple while it is current, else without.
    pub fn key_at(&self, now: SystemTime) -> Arc<CertifiedKey> {
        match &*self.current.read().unwrap_or_else(|e| e.into_inner()) {
            Some((k, s)) if s.next_update > now => k.clone(),
            _ => self.plain.clone(),
        }
    }

    /// The staple's status, while one is current.
    pub fn status_at(&self, now: SystemTime) -> Option<OcspStatus> {
        match &*self.current.read().unwrap_or_else(|e| e.into_inner()) {
            Some((_, s)) if s.next_update > now => Some(s.clone()),
            _ => None,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn generalized_times() {
        let t = generalized_time(b"19700101000000Z").unwrap();
        assert_eq!(t, SystemTime::UNIX_EPOCH);
        let t = generalized_time(b"20240229123456Z").unwrap();
        assert_eq!(
            t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(),
            1_709_210_096
        );
        for bad in [
            &b"2024022912345Z"[..],
            b"20241329123456Z",
            b"2024022912345aZ",
            b"",
        ] {
            assert!(generalized_time(bad).is_err());
        }
    }

    /// Any bytes: an error, never a panic.
    #[test]
    fn random_bytes_never_panic() {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["a.test".into()])
            .unwrap()
            .self_signed(&kp)
            .unwrap();
        let der = cert.der().to_vec();
        assert!(leaf_id(&der).is_ok());
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        for round in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 96) as usize;
            let mut b: Vec<u8> = (0..len).map(|i| (seed >> (i % 57)) as u8).collect();
            if round % 3 == 0 && len > 4 {
                // plausible outer SEQUENCE and status
                b[0] = SEQ;
                b[1] = (len - 2).min(127) as u8;
                b[2] = 0x0a;
                b[3] = 1;
            }
            assert!(check_response(&b, &der, SystemTime::now()).is_err());
            let _ = leaf_id(&b);
        }
    }

    /// A basic OCSP response for `cert` (status `status_tlv`, times as GeneralizedTime
    /// strings), with a wrong serial number when `wrong_serial`.
    /// `t` as a GeneralizedTime (`YYYYMMDDHHMMSSZ`).
    pub(crate) fn generalized(t: SystemTime) -> String {
        let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64;
        let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
        let (y, m, d) = crate::utc::civil_from_days(days);
        format!(
            "{y:04}{m:02}{d:02}{:02}{:02}{:02}Z",
            rem / 3600,
            rem / 60 % 60,
            rem % 60
        )
    }

    #[test]
    fn generalized_is_the_inverse_of_the_parser() {
        for s in ["19700101000000Z", "20240229123456Z", "20991231235959Z"] {
            assert_eq!(generalized(generalized_time(s.as_bytes()).unwrap()), s);
        }
    }

    pub(crate) fn response(
        cert: &[u8],
        status_tlv: &[u8],
        this: &str,
        next: Option<&str>,
        wrong_serial: bool,
    ) -> Vec<u8> {
        let leaf = leaf_id(cert).unwrap();
        let name_hash = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &leaf.issuer);
        let mut serial = leaf.serial.clone();
        if wrong_serial {
            let last = serial.len() - 1;
            serial[last] ^= 1;
        }
        let cert_id = tlv(
            SEQ,
            &[
                tlv(SEQ, &tlv(0x06, OID_SHA256)),
                tlv(0x04, name_hash.as_ref()),
                tlv(0x04, &[0; 32]),
                tlv(0x02, &serial),
            ]
            .concat(),
        );
        let mut single = [cert_id, status_tlv.to_vec(), tlv(0x18, this.as_bytes())].concat();
        if let Some(n) = next {
            single.extend(tlv(0xa0, &tlv(0x18, n.as_bytes())));
        }
        let tbs = tlv(
            SEQ,
            &[
                tlv(0xa2, &tlv(0x04, &[1; 20])),
                tlv(0x18, b"20240101000000Z"),
                tlv(SEQ, &tlv(SEQ, &single)),
            ]
            .concat(),
        );
        let basic = tlv(SEQ, &[tbs, tlv(SEQ, &[]), tlv(0x03, &[0, 1, 2])].concat());
        let bytes = tlv(SEQ, &[tlv(0x06, OID_BASIC), tlv(0x04, &basic)].concat());
        tlv(SEQ, &[tlv(0x0a, &[0]), tlv(0xa0, &bytes)].concat())
    }

    #[test]
    fn stapled_only_while_current_good_and_for_this_certificate() {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["a.test".into()]).unwrap();
        params.serial_number = Some(rcgen::SerialNumber::from(vec![0x12, 0x34]));
        let cert = params.self_signed(&kp).unwrap();
        let der = cert.der().to_vec();
        let at = |s: &str| generalized_time(s.as_bytes()).unwrap();
        let now = at("20250601000000Z");
        let good = [0x80, 0x00];
        let ok = response(
            &der,
            &good,
            "20250531000000Z",
            Some("20250602000000Z"),
            false,
        );
        let st = check_response(&ok, &der, now).unwrap();
        assert_eq!(st.next_update, at("20250602000000Z"));
        let cases: [(Vec<u8>, OcspError); 5] = [
            (
                response(
                    &der,
                    &good,
                    "20250530000000Z",
                    Some("20250531000000Z"),
                    false,
                ),
                OcspError::Expired,
            ),
            (
                response(&der, &good, "20250530000000Z", None, false),
                OcspError::Expired,
            ),
            (
                response(
                    &der,
                    &good,
                    "20250602000000Z",
                    Some("20250603000000Z"),
                    false,
                ),
                OcspError::NotYetValid,
            ),
            (
                response(
                    &der,
                    &good,
                    "20250531000000Z",
                    Some("20250602000000Z"),
                    true,
                ),
                OcspError::Mismatch,
            ),
            (
                response(
                    &der,
                    &tlv(0xa1, &tlv(0x18, b"20250101000000Z")),
                    "20250531000000Z",
                    Some("20250602000000Z"),
                    false,
                ),
                OcspError::NotGood("revoked"),
            ),
        ];
        for (resp, want) in cases {
            assert_eq!(check_response(&resp, &der, now), Err(want));
        }
        // every truncation is an error, never a panic
        for n in 0..ok.len() {
            assert!(check_response(&ok[..n], &der, now).is_err());
        }

        // the holder: stapled while current, plain after nextUpdate, a bad response keeps
        // the good one
        let key = rustls::crypto::aws_lc_rs::sign::any_supported_type(
            &rustls_pki_types::PrivateKeyDer::try_from(kp.serialize_der()).unwrap(),
        )
        .unwrap();
        let plain = Arc::new(CertifiedKey::new(vec![der.clone().into()], key));
        let holder = OcspStaple::new(plain.clone());
        assert!(holder.key_at(now).ocsp.is_none());
        holder.set(ok.clone(), now).unwrap();
        assert_eq!(holder.key_at(now).ocsp.as_deref(), Some(&ok[..]));
        assert!(holder.set(b"junk".to_vec(), now).is_err());
        assert_eq!(holder.key_at(now).ocsp.as_deref(), Some(&ok[..]));
        assert_eq!(
            holder.failures.load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        let later = at("20250602000000Z");
        assert!(
            holder.key_at(later).ocsp.is_none(),
            "expired: never stapled"
        );
        assert!(holder.status_at(later).is_none());
    }

    /// The request is byte for byte what `openssl ocsp -no_nonce -reqout` makes, and the
    /// responder URL is read from the certificate.
    #[test]
    fn request_matches_openssl_and_the_url_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .current_dir(d)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-subj",
            "/CN=CA",
            "-days",
            "2",
        ]);
        run(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "l.key",
            "-out",
            "l.csr",
            "-subj",
            "/CN=l",
        ]);
        std::fs::write(
            d.join("e.ext"),
            "authorityInfoAccess=caIssuers;URI:http://x/ca,OCSP;URI:http://127.0.0.1:8888/q\n",
        )
        .unwrap();
        run(&[
            "x509",
            "-req",
            "-in",
            "l.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-set_serial",
            "0x00ff",
            "-out",
            "l.crt",
            "-days",
            "1",
            "-extfile",
            "e.ext",
        ]);
        run(&[
            "ocsp",
            "-issuer",
            "ca.crt",
            "-cert",
            "l.crt",
            "-no_nonce",
            "-reqout",
            "req.der",
        ]);
        let pem = |name: &str| {
            let text = std::fs::read(d.join(name)).unwrap();
            rustls_pki_types::pem::PemObject::from_pem_slice(&text)
                .map(|c: rustls_pki_types::CertificateDer<'static>| c.to_vec())
                .unwrap()
        };
        let (leaf, ca) = (pem("l.crt"), pem("ca.crt"));
        assert_eq!(
            responder_url(&leaf).unwrap().as_deref(),
            Some("http://127.0.0.1:8888/q")
        );
        assert_eq!(responder_url(&ca).unwrap(), None);
        let want = std::fs::read(d.join("req.der")).unwrap();
        assert_eq!(request(&leaf, &ca).unwrap(), want);
        assert!(request(&leaf, &leaf).is_err(), "not its issuer");
    }
}
