//! qweb's HTTP cache: the policy of RFC 9111 for a shared cache ([`policy`], on the
//! directives of [`directives`]), the memory store every worker shares ([`store`]: bounded
//! in bytes, variants per key, collapsed fills), the body that fills it while the response
//! streams ([`fill`]) and whose growing body the requests waiting on the fill read while it
//! is written ([`shared`]), and the `Cache-Status` field of RFC 9211 ([`status`]). The store's
//! disk tier ([`Store::open`]) keeps one checksummed file per entry ([`format`](mod@format)), written by a
//! thread of its own and read in blocking tasks, so that a restart finds what was stored.
//!
//! It knows nothing of routes or connections: the server's pipeline asks it, per request of
//! a cached route, what is stored and whether it may be served, and hands it the origin's
//! responses.

pub mod directives;
mod disk;
pub mod fill;
pub mod format;
mod memfd;
pub mod policy;
pub mod shared;
pub mod status;
pub mod store;

pub use fill::{FillBody, Pending};
pub use policy::{reuse, storable, Meta, NotStorable, Reuse};
pub use shared::{FillFailed, Follower, InFlight, Shared};
pub use status::CacheStatus;
pub use store::{Entry, Eviction, Fill, FillGuard, Limits, Stats, Store, StoredBody};
