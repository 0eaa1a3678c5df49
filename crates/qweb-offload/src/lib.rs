//! qweb's offload framework (see DESIGN.md: Op, Engine, offload mode, Job).
//!
//! - [`Op`]: one unit of offloadable work: a private-key signature, or one chunk of a
//!   compressed response ([`compress::CompressOp`]), a check of the caller's own ([`CheckOp`]:
//!   a password hash verification). Plain data in, plain data out.
//! - [`Engine`]: executes ops and reports completions; [`InlineEngine`] runs them on the
//!   caller's thread (the software baseline), [`PoolEngine`] on dedicated threads behind a
//!   bounded queue.
//! - [`Completion`]: the result of one op, awaited by a task (async) or waited for by a thread
//!   (sync).
//! - [`job`]: runs synchronous library code (rustls' `process_new_packets`) on a stackful
//!   coroutine so that an offload inside it can pause it and be resumed later.
//! - [`Offloader`]: a worker's handle on an engine: batches submissions ("heuristic polling"),
//!   applies the per-op timeout.
//! - [`metrics`]: per-engine counters, gauges and a latency histogram.
//! - [`policy`]: the offload policy that TLS, compression and the configuration share:
//!   [`Mode`] (in place, sync, async/pipelined), [`Fallback`] (software or fail), and
//!   [`Policy`] (mode, fallback, timeout).
//!
//! Nothing here knows about HTTP or TLS.

mod completion;
pub mod compress;
mod engine;
pub mod job;
mod key;
pub mod metrics;
mod offloader;
mod op;
pub mod policy;

pub use completion::{channel, Completer, Completion, Delivery};
pub use engine::{
    run_blocking, Engine, EngineSet, InlineEngine, PoolConfig, PoolEngine, Submission,
};
pub use key::{KeyError, KeyKind, LocalKey};
pub use metrics::EngineMetrics;
pub use offloader::{BatchConfig, Offloader, Timed};
pub use op::{CheckOp, KeyId, KeyRef, Op, OpError, OpOutput, OpResult, SignOp, SignScheme};
pub use policy::{Fallback, Mode, Policy};
