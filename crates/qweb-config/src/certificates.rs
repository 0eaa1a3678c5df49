//! Certificates of listeners and sites, validated alike: `cert`, `key` (or none, where a
//! key server holds it), `ocsp` (a DER file or `"fetch"`). A site's certificates join every
//! TLS listener that has `certificates`; a site certificate without `key` needs each of those
//! listeners to sign on a key server.

use super::offload::signs_on_keyserver;
use super::raw::{RawCertificate, RawConfig};
use super::{
    CertificateConfig, ConfigError, ListenerConfig, OcspSource, OffloadConfig, SitesConfig,
    TlsConfig, Validator,
};

impl Validator<'_> {
    /// Validates the certificate at `key` (e.g. `listener[0].tls.certificates[1]`): its
    /// chain and key load and match, or, without `key`, its chain names a key server key.
    /// `keyless`: `Err(message)` when a missing `key` is an error here.
    pub(super) fn certificate(
        &self,
        key: &str,
        c: &RawCertificate,
        keyless: Result<(), &str>,
    ) -> Result<CertificateConfig, ConfigError> {
        let cert = self.path(c.cert.get_ref(), c.cert.span());
        let Some(ck) = &c.key else {
            if let Err(m) = keyless {
                return Err(self.err(Some(c.cert.span()), format!("{key}.key"), m));
            }
            if let Err(e) = qweb_tls::cert_key_id(&cert) {
                return Err(self.err(Some(c.cert.span()), format!("{key}.cert"), e.to_string()));
            }
            return Ok(CertificateConfig {
                cert,
                key: None,
                ocsp: self.ocsp(key, c)?,
            });
        };
        let keyp = self.path(ck.get_ref(), ck.span());
        if let Err(e) = qweb_tls::load_certified_key(&cert, &keyp, &qweb_tls::provider()) {
            let (span, which) = match &e {
                qweb_tls::TlsError::Key { .. } => (ck.span(), "key"),
                qweb_tls::TlsError::Read { path, .. } | qweb_tls::TlsError::Pem { path, .. }
                    if *path == keyp =>
                {
                    (ck.span(), "key")
                }
                _ => (c.cert.span(), "cert"),
            };
            return Err(self.err(Some(span), format!("{key}.{which}"), e.to_string()));
        }
        Ok(CertificateConfig {
            cert,
            key: Some(keyp),
            ocsp: self.ocsp(key, c)?,
        })
    }

    /// `ocsp` of the certificate at `key`: a readable DER file, or `"fetch"` for a chain
    /// that names its responder and holds its issuer.
    fn ocsp(&self, key: &str, c: &RawCertificate) -> Result<Option<OcspSource>, ConfigError> {
        let Some(o) = &c.ocsp else { return Ok(None) };
        let key = format!("{key}.ocsp");
        let v = o.get_ref().trim();
        if v == "fetch" {
            let cert = self.path(c.cert.get_ref(), c.cert.span());
            let chain = qweb_tls::load_certs(&cert)
                .map_err(|e| self.err(Some(o.span()), key.as_str(), e.to_string()))?;
            let url = qweb_tls::ocsp::responder_url(chain[0].as_ref())
                .map_err(|e| self.err(Some(o.span()), key.as_str(), e.to_string()))?;
            if url.is_none() {
                return Err(self.err(
                    Some(o.span()),
                    key,
                    format!(
                        "{} has no http:// OCSP responder (Authority Information Access)",
                        cert.display()
                    ),
                ));
            }
            if chain.len() < 2 {
                return Err(self.err(
                    Some(o.span()),
                    key,
                    format!("{} must hold the issuer's certificate after the leaf (the OCSP request names the issuer's key)", cert.display()),
                ));
            }
            return Ok(Some(OcspSource::Fetch));
        }
        if v.is_empty() {
            return Err(self.err(Some(o.span()), key, "a DER OCSP response file"));
        }
        let path = self.path(std::path::Path::new(v), o.span());
        if let Err(e) = std::fs::metadata(&path).and_then(|m| {
            if m.is_file() {
                Ok(())
            } else {
                Err(std::io::Error::other("not a file"))
            }
        }) {
            return Err(self.err(
                Some(o.span()),
                key,
                format!("cannot read {}: {e}", path.display()),
            ));
        }
        Ok(Some(OcspSource::File(path)))
    }

    /// Adds the sites' certificates to every TLS listener with `certificates` (the default
    /// site's first, so clients without SNI get it); a certificate file listed twice is
    /// added once. A site certificate without `key` is refused unless each such listener
    /// signs on a key server.
    pub(super) fn add_site_certificates(
        &self,
        raw: &RawConfig,
        sites: &SitesConfig,
        listeners: &mut [ListenerConfig],
        engines: &OffloadConfig,
    ) -> Result<(), ConfigError> {
        let order = sites
            .default
            .into_iter()
            .chain((0..sites.sites.len()).filter(|i| Some(*i) != sites.default));
        // each certificate with its place: (site, index in the site's list)
        let mut all: Vec<(&CertificateConfig, usize, usize)> = Vec::new();
        for s in order {
            for (j, c) in sites.sites[s].certificates.iter().enumerate() {
                if !all.iter().any(|(o, _, _)| o.cert == c.cert) {
                    all.push((c, s, j));
                }
            }
        }
        let Some(&(_, first_site, _)) = all.first() else {
            return Ok(());
        };
        let span = |s: usize, j: usize| {
            raw.sites
                .get(s)
                .and_then(|site| site.get_ref().certificates.get(j))
                .map(|c| c.cert.span())
        };
        for (i, l) in listeners.iter_mut().enumerate() {
            let keyserver = signs_on_keyserver(l.offload.as_ref(), engines);
            match &mut l.tls {
                Some(TlsConfig::Certificates(list)) => {
                    for (c, s, j) in &all {
                        if c.key.is_none() && !keyserver {
                            return Err(self.err(
                                span(*s, *j),
                                format!("site[{s}].certificates[{j}].key"),
                                format!(
                                    "missing: a site's certificate without a key file needs every TLS listener with `certificates` to sign on a key server, and listener[{i}]'s offload engine is not a key server (mode sync or async)"
                                ),
                            ));
                        }
                        if !list.iter().any(|o| o.cert == c.cert) {
                            list.push((*c).clone());
                        }
                    }
                }
                Some(TlsConfig::SelfSigned) => {
                    return Err(self.err(
                        span(first_site, 0),
                        format!("site[{first_site}].certificates"),
                        format!(
                            "listener[{i}] uses `self_signed = true`; sites' certificates need TLS listeners with `certificates` (an empty list takes the sites')"
                        ),
                    ));
                }
                None => {}
            }
        }
        Ok(())
    }
}
