//! The rustls `ServerConfig` qweb uses.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::ResolvesServerCert;
use rustls::ServerConfig;

use crate::{ClientAuth, TlsError};

/// ALPN protocol id of HTTP/2.
pub const ALPN_H2: &[u8] = b"h2";
/// ALPN protocol id of HTTP/1.1.
pub const ALPN_HTTP11: &[u8] = b"http/1.1";

/// The crypto provider: aws-lc-rs (key exchange, signatures, certificate checks, the
/// randomness), with rustls' default cipher suites; on x86-64 the suites' record encryption
/// and hashes come from ring, whose AES-GCM uses VAES and VPCLMULQDQ on 256-bit registers
/// where the CPU has them (AMD Zen 3 and later, Intel Ice Lake and later) and otherwise the
/// same AES-NI code as aws-lc. aws-lc 0.47 has no such path short of AVX-512: on the AMD EPYC
/// machines qweb is measured on its AES-GCM was 38 % of a worker's samples serving 1 MiB
/// over TLS (docs/BENCHMARKS.md).
pub fn provider() -> CryptoProvider {
    let aws_lc = rustls::crypto::aws_lc_rs::default_provider();
    #[cfg(target_arch = "x86_64")]
    let aws_lc = CryptoProvider {
        cipher_suites: rustls::crypto::ring::DEFAULT_CIPHER_SUITES.to_vec(),
        ..aws_lc
    };
    aws_lc
}

/// A server configuration: TLS 1.2 and 1.3, certificates from `resolver`, ALPN `h2` (when
/// `http2` is set) then `http/1.1`; client certificates checked by `client_auth`'s verifier
/// (`None`: none asked for).
pub fn server_config(
    resolver: Arc<dyn ResolvesServerCert>,
    http2: bool,
    client_auth: Option<&ClientAuth>,
) -> Result<ServerConfig, TlsError> {
    let builder = ServerConfig::builder_with_provider(Arc::new(provider()))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match client_auth {
        Some(c) => builder.with_client_cert_verifier(c.verifier.clone()),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(resolver);
    if http2 {
        config.alpn_protocols.push(ALPN_H2.to_vec());
    }
    config.alpn_protocols.push(ALPN_HTTP11.to_vec());
    Ok(config)
}

#[cfg(test)]
mod tests {
    use rustls::SupportedCipherSuite;

    use super::provider;

    fn same(a: &SupportedCipherSuite, b: &SupportedCipherSuite) -> bool {
        match (a, b) {
            (SupportedCipherSuite::Tls13(x), SupportedCipherSuite::Tls13(y)) => {
                std::ptr::eq(*x, *y)
            }
            (SupportedCipherSuite::Tls12(x), SupportedCipherSuite::Tls12(y)) => {
                std::ptr::eq(*x, *y)
            }
            _ => false,
        }
    }

    /// The provider offers rustls' default suites in their order (the same preference as
    /// aws-lc-rs' default provider), with ring's implementations on x86-64 and aws-lc's
    /// elsewhere; key exchange stays aws-lc's.
    #[test]
    fn suites_keep_the_default_order_with_ring_record_encryption_on_x86_64() {
        let p = provider();
        let aws_lc = rustls::crypto::aws_lc_rs::default_provider();
        let ids = |s: &[SupportedCipherSuite]| s.iter().map(|c| c.suite()).collect::<Vec<_>>();
        assert_eq!(ids(&p.cipher_suites), ids(&aws_lc.cipher_suites));
        let expected: &[SupportedCipherSuite] = if cfg!(target_arch = "x86_64") {
            rustls::crypto::ring::DEFAULT_CIPHER_SUITES
        } else {
            rustls::crypto::aws_lc_rs::DEFAULT_CIPHER_SUITES
        };
        assert!(p
            .cipher_suites
            .iter()
            .zip(expected)
            .all(|(a, b)| same(a, b)));
        assert_eq!(p.kx_groups.len(), aws_lc.kx_groups.len());
        assert!(p
            .kx_groups
            .iter()
            .zip(&aws_lc.kx_groups)
            .all(|(a, b)| a.name() == b.name()));
    }
}
