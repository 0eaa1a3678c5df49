//! TLS state of the running server: each listener's session resumption and OCSP staples
//! (`session`), fetching OCSP responses (`ocsp_fetch`), the key server clients (`keyserver`),
//! and certificates ordered and renewed from an ACME CA (`acme`).

pub(crate) mod acme;
pub(crate) mod fleet_tickets;
pub(crate) mod keyserver;
pub(crate) mod ocsp_fetch;
pub(crate) mod session;
