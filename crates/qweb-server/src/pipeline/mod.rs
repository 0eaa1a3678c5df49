//! The request pipeline: the per-connection service and its phases (request rules, site selection, rewrite, routing, traffic control, authentication, the proxy cache, the handler, error pages, header rules, compression glue).

pub(crate) mod auth;
pub(crate) mod cache;
pub(crate) mod cache_head;
pub(crate) mod collapse;
pub(crate) mod compress;
pub(crate) mod ctx;
pub(crate) mod error_pages;
pub(crate) mod forward_auth;
pub(crate) mod headers_rules;
pub(crate) mod rewrite;
pub(crate) mod routes;
pub(crate) mod service;
pub(crate) mod sites;
pub(crate) mod traffic;
