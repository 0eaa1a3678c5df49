//! Idle connections held open for the memory measurements.

use super::*;

/// Idle connections held open (experiment F): each did a full handshake and one request and
/// now sits idle. Dropping the set closes them.
pub struct IdleSet {
    held: Vec<(Sender, tokio::task::JoinHandle<()>)>,
    /// Connections that failed to open, by kind.
    pub errors: ErrorCounts,
    /// The first few error messages.
    pub error_samples: Vec<String>,
    rt: Option<tokio::runtime::Runtime>,
}

impl IdleSet {
    /// Opens `n` connections to `spec.url` (`spec.connections` at a time), each with one
    /// checked request.
    pub fn open(spec: &LoadSpec, n: usize) -> Result<IdleSet> {
        let target = parse_target(&spec.url)?;
        let connector = TlsConnector::from(crate::tls::client_config(spec.tls, spec.http)?);
        crate::raise_fd_limit(n as u64 * 2 + 1024);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(spec.threads.unwrap_or_else(crate::cpus).max(1))
            .enable_all()
            .build()
            .map_err(|e| Error::io("start the client runtime", e))?;
        let now = Instant::now();
        let sh = Arc::new(Shared {
            timeout: Duration::from_secs_f64(spec.timeout),
            tickets: None,
            spec: spec.clone(),
            target,
            others: vec![],
            next_target: AtomicU64::new(0),
            connector,
            resume_connector: None,
            rsa_connector: None,
            quic: match spec.http {
                HttpVersion::H3 => Some(quic::client_config(crate::tls::client_config(
                    spec.tls, spec.http,
                )?)?),
                _ => None,
            },
            tally: Arc::default(),
            start: now,
            warmup_end: now,
            end: now,
            last_done: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let stats: Stats = Arc::default();
        let held = rt.block_on(async {
            let sem = Arc::new(tokio::sync::Semaphore::new(spec.connections.max(1)));
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..n {
                let (sh, stats, sem) = (sh.clone(), stats.clone(), sem.clone());
                set.spawn(async move {
                    let _permit = sem.acquire_owned().await.ok()?;
                    let open = async {
                        let (mut s, c) = match sh.spec.http {
                            // an endpoint (UDP port) per connection, as separate clients; it
                            // lives on while its connection does
                            HttpVersion::H3 => quic::open(&sh, &quic::endpoint(&sh)?).await?,
                            _ => {
                                let (tls, _) = connect_tls(&sh, false, false).await?;
                                http_handshake(&sh, tls).await?
                            }
                        };
                        match request(&sh, &mut s).await {
                            Ok(_) => Ok((s, c)),
                            Err(e) => {
                                c.abort();
                                Err(e)
                            }
                        }
                    };
                    match tokio::time::timeout(sh.timeout, open).await {
                        Ok(Ok(x)) => Some(x),
                        Ok(Err(e)) => {
                            record_error(&stats, e);
                            None
                        }
                        Err(_) => {
                            record_error(&stats, OpError::Timeout);
                            None
                        }
                    }
                });
            }
            let mut held = Vec::with_capacity(n);
            while let Some(r) = set.join_next().await {
                if let Ok(Some(x)) = r {
                    held.push(x);
                }
            }
            held
        });
        let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
        Ok(IdleSet {
            held,
            errors: std::mem::take(&mut s.errors),
            error_samples: std::mem::take(&mut s.messages),
            rt: Some(rt),
        })
    }

    /// Connections open now.
    pub fn len(&self) -> usize {
        self.held.iter().filter(|(_, c)| !c.is_finished()).count()
    }

    /// Whether no connection is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for IdleSet {
    fn drop(&mut self) {
        for (_, c) in self.held.drain(..) {
            c.abort();
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}
