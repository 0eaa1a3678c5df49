//! A small DER reader for what qweb reads in certificates and OCSP responses: a
//! certificate's issuer, subject, key, extensions and validity; OCSP response fields.

use std::time::{Duration, SystemTime};

/// What is wrong with DER input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DerError {
    /// Not the DER structure expected.
    #[error("malformed DER: {0}")]
    Malformed(&'static str),
    /// A certificate's fields could not be read.
    #[error("cannot read the certificate: {0}")]
    Certificate(&'static str),
}

#[derive(Clone, Copy)]
pub(crate) struct Der<'a>(pub(crate) &'a [u8]);

impl<'a> Der<'a> {
    /// The next TLV: (tag, contents, whole TLV).
    pub(crate) fn next(&mut self) -> Result<(u8, &'a [u8], &'a [u8]), DerError> {
        let bad = DerError::Malformed;
        let b = self.0;
        if b.len() < 2 {
            return Err(bad("truncated"));
        }
        let tag = b[0];
        if tag & 0x1f == 0x1f {
            return Err(bad("long tags are not used in OCSP"));
        }
        let (len, hdr) = match b[1] {
            n if n < 0x80 => (usize::from(n), 2),
            0x81..=0x84 => {
                let k = usize::from(b[1] & 0x7f);
                if b.len() < 2 + k {
                    return Err(bad("truncated length"));
                }
                let mut len = 0usize;
                for &x in &b[2..2 + k] {
                    len = (len << 8) | usize::from(x);
                }
                (len, 2 + k)
            }
            _ => return Err(bad("unsupported length")),
        };
        let end = hdr.checked_add(len).ok_or(bad("length"))?;
        if end > b.len() {
            return Err(bad("truncated contents"));
        }
        self.0 = &b[end..];
        Ok((tag, &b[hdr..end], &b[..end]))
    }

    pub(crate) fn expect(&mut self, want: u8, what: &'static str) -> Result<&'a [u8], DerError> {
        match self.next()? {
            (t, c, _) if t == want => Ok(c),
            _ => Err(DerError::Malformed(what)),
        }
    }

    pub(crate) fn peek_tag(&self) -> Option<u8> {
        self.0.first().copied()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

pub(crate) const SEQ: u8 = 0x30;

/// `YYYYMMDDHHMMSSZ` (GeneralizedTime, as RFC 5280 requires) to a time.
pub(crate) fn generalized_time(v: &[u8]) -> Result<SystemTime, DerError> {
    let bad = || DerError::Malformed("time");
    if v.len() != 15 || v[14] != b'Z' || !v[..14].iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    let n = |r: std::ops::Range<usize>| {
        v[r].iter()
            .fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0'))
    };
    let (y, mo, d, h, mi, s) = (n(0..4), n(4..6), n(6..8), n(8..10), n(10..12), n(12..14));
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return Err(bad());
    }
    let days = crate::utc::days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3600 + mi * 60 + s;
    let secs = u64::try_from(secs).map_err(|_| bad())?;
    Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

/// A certificate's tbsCertificate fields, from its serial number on (the version, when
/// present, skipped).
pub(crate) fn tbs_fields(cert: &[u8]) -> Result<Der<'_>, DerError> {
    let c = DerError::Certificate;
    let mut top = Der(cert);
    let mut certificate = Der(top
        .expect(SEQ, "certificate")
        .map_err(|_| c("not a SEQUENCE"))?);
    let mut tbs = Der(certificate
        .expect(SEQ, "tbs")
        .map_err(|_| c("no tbsCertificate"))?);
    if tbs.peek_tag() == Some(0xa0) {
        tbs.next().map_err(|_| c("version"))?;
    }
    Ok(tbs)
}

/// The parts of a certificate after its issuer: subject Name DER, subjectPublicKey bits,
/// extensions DER if any.
pub(crate) type CertParts = (Vec<u8>, Vec<u8>, Option<Vec<u8>>);

pub(crate) fn cert_parts(cert: &[u8]) -> Result<CertParts, DerError> {
    let c = DerError::Certificate;
    let mut tbs = tbs_fields(cert)?;
    for what in ["serial", "signature", "issuer", "validity"] {
        tbs.next().map_err(|_| c(what))?;
    }
    let (_, _, subject) = tbs.next().map_err(|_| c("subject"))?;
    let mut spki = Der(tbs.expect(SEQ, "spki").map_err(|_| c("no public key"))?);
    spki.expect(SEQ, "alg")
        .map_err(|_| c("no public key algorithm"))?;
    let bits = spki.expect(0x03, "key").map_err(|_| c("no public key"))?;
    let key = bits.get(1..).ok_or(c("empty public key"))?.to_vec();
    let mut extensions = None;
    while !tbs.is_empty() {
        let (tag, content, _) = tbs.next().map_err(|_| c("trailing fields"))?;
        if tag == 0xa3 {
            extensions = Some(content.to_vec());
        }
    }
    Ok((subject.to_vec(), key, extensions))
}

/// A certificate's validity: `notBefore` and `notAfter` (UTCTime or GeneralizedTime).
pub fn validity(cert: &[u8]) -> Result<(SystemTime, SystemTime), DerError> {
    let c = DerError::Certificate;
    let mut tbs = tbs_fields(cert)?;
    for what in ["serial", "signature", "issuer"] {
        tbs.next().map_err(|_| c(what))?;
    }
    let mut v = Der(tbs.expect(SEQ, "validity").map_err(|_| c("no validity"))?);
    let mut time = || -> Result<SystemTime, DerError> {
        match v.next().map_err(|_| c("validity"))? {
            (0x18, t, _) => generalized_time(t),
            // UTCTime YYMMDDHHMMSSZ: 50-99 are 19xx (RFC 5280 4.1.2.5.1)
            (0x17, t, _) if t.len() == 13 => {
                let century: &[u8] = if t[0] >= b'5' { b"19" } else { b"20" };
                generalized_time(&[century, t].concat())
            }
            _ => Err(c("validity time")),
        }
    };
    let not_before = time()?;
    let not_after = time()?;
    Ok((not_before, not_after))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rcgen writes dates before 2050 as UTCTime and later ones as GeneralizedTime (RFC 5280
    /// 4.1.2.5): both are read.
    #[test]
    fn validity_reads_utc_and_generalized_times() {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["v.test".to_owned()]).unwrap();
        p.not_before = rcgen::date_time_ymd(2030, 1, 2);
        p.not_after = rcgen::date_time_ymd(2051, 3, 4);
        let cert = p.self_signed(&kp).unwrap();
        let (nb, na) = validity(cert.der()).unwrap();
        let secs = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(secs(nb), 1_893_542_400); // 2030-01-02T00:00:00Z
        assert_eq!(secs(na), 2_561_500_800); // 2051-03-04T00:00:00Z
        assert!(validity(&cert.der()[..40]).is_err());
        assert!(validity(b"").is_err());
    }
}
