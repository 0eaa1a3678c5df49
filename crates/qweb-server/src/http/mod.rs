//! HTTP primitives, the bottom layer: response bodies, generated responses, request-path normalisation, request rules and the raw head scan. Imports nothing above it but `config`.

pub(crate) mod body;
pub(crate) mod head_scan;
pub(crate) mod path;
pub(crate) mod request_rules;
pub(crate) mod response;
