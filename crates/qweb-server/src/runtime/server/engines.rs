//! The offload engines a configuration names, built (or kept across a reload).

use super::*;
use crate::runtime::tls::keyserver::keyserver_client_tls;

pub(super) fn build_engines(
    config: &Config,
    previous: &HashMap<String, BuiltEngine>,
) -> Result<HashMap<String, BuiltEngine>, ServerError> {
    let mut engines = HashMap::new();
    for e in &config.offload.engines {
        let fingerprint = format!("{:?}", e.kind);
        let engine = match previous.get(&e.name) {
            Some(p) if p.config == fingerprint => p.engine.clone(),
            _ => new_engine(e)?,
        };
        engines.insert(
            e.name.clone(),
            BuiltEngine {
                config: fingerprint,
                engine,
            },
        );
    }
    Ok(engines)
}

pub(super) fn new_engine(e: &EngineConfig) -> Result<Arc<dyn Engine>, ServerError> {
    let failed = |source| ServerError::Engine {
        name: e.name.clone(),
        source,
    };
    Ok(match &e.kind {
        EngineKind::Inline => Arc::new(InlineEngine::new(e.name.clone())),
        EngineKind::Keyserver(k) => Arc::new(
            qweb_keyserver::client::KeyserverEngine::new(
                e.name.clone(),
                qweb_keyserver::client::ClientConfig {
                    servers: k.servers.clone(),
                    connections: k.connections,
                    max_in_flight: k.queue,
                    timeout: k.timeout,
                    tls: keyserver_client_tls(k)?,
                },
            )
            .map_err(failed)?,
        ),
        EngineKind::Pool {
            threads,
            queue,
            added_latency,
            inject_failures,
        } => Arc::new(
            PoolEngine::new(
                e.name.clone(),
                PoolConfig {
                    threads: *threads,
                    queue: *queue,
                    added_latency: *added_latency,
                    inject_failures: *inject_failures,
                },
            )
            .map_err(failed)?,
        ),
    })
}

pub(super) fn engine_list(engines: &HashMap<String, BuiltEngine>) -> Vec<Arc<dyn Engine>> {
    let mut list: Vec<&BuiltEngine> = engines.values().collect();
    list.sort_by(|a, b| a.engine.name().cmp(b.engine.name()));
    list.into_iter().map(|b| b.engine.clone()).collect()
}
