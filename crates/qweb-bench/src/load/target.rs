//! The target of a run: an https:// URL, resolved.

use std::net::{SocketAddr, ToSocketAddrs};

use http::Uri;
use rustls::pki_types::ServerName;

use crate::{Error, Result};

/// The parsed target.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub(super) addr: SocketAddr,
    pub(super) server_name: ServerName<'static>,
    pub(super) authority: String,
    pub(super) path: String,
    pub(super) uri: Uri,
}

pub(super) fn parse_target(url: &str) -> Result<Target> {
    let uri: Uri = url
        .parse()
        .map_err(|e| Error::Arg(format!("URL {url:?}: {e}")))?;
    if uri.scheme_str() != Some("https") {
        return Err(Error::Arg(format!(
            "URL {url:?}: only https:// is supported"
        )));
    }
    let auth = uri
        .authority()
        .ok_or_else(|| Error::Arg(format!("URL {url:?}: no host")))?
        .clone();
    let host = auth.host().trim_start_matches('[').trim_end_matches(']');
    let port = auth.port_u16().unwrap_or(443);
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::io(format!("resolve {host}"), e))?
        .next()
        .ok_or_else(|| Error::Arg(format!("URL {url:?}: {host} resolves to nothing")))?;
    let server_name = ServerName::try_from(host.to_string())
        .map_err(|e| Error::Arg(format!("URL {url:?}: server name: {e}")))?;
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    Ok(Target {
        addr,
        server_name,
        authority: auth.as_str().to_string(),
        path,
        uri,
    })
}
