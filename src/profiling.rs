//! Measurement builds (never the default): the cost of a request, read from the real server.
//!
//! - Feature `alloc-count`: the global allocator (mimalloc) counts every allocation and its
//!   bytes; `/metrics` shows them as `qweb_allocations_total` and
//!   `qweb_allocated_bytes_total`. Allocations per request = the difference over a load run
//!   divided by the difference of `qweb_http_requests_total`.
//! - Feature `profile`: with `QWEB_PROFILE=out.svg` in the environment, a sampling profiler
//!   (the `pprof` crate, on `setitimer(ITIMER_PROF)`: no perf counters needed) runs from start
//!   to exit at `QWEB_PROFILE_HZ` (default 499) samples per second of CPU time and writes a
//!   flame graph to `out.svg` and the folded stacks to `out.svg.folded` when qweb stops.
//!
//! docs/bench/history.md ("Method: where a request's cost goes") shows how to use both.

#[cfg(feature = "alloc-count")]
#[allow(unsafe_code)]
pub(crate) mod alloc_count {
    use std::alloc::{GlobalAlloc, Layout};
    use std::sync::atomic::{AtomicU64, Ordering};

    static ALLOCS: AtomicU64 = AtomicU64::new(0);
    static BYTES: AtomicU64 = AtomicU64::new(0);

    /// Counts allocations (and reallocations, each as one) and their bytes, then defers to
    /// mimalloc.
    pub(crate) struct Counting;

    // SAFETY: every method forwards its arguments unchanged to mimalloc's `GlobalAlloc`
    // implementation, which upholds the trait's contract; counting touches only atomics.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
            // SAFETY: the caller's contract for `alloc` is passed on unchanged.
            unsafe { mimalloc::MiMalloc.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
            // SAFETY: as `alloc`.
            unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` came from this allocator, i.e. from mimalloc, with `layout`.
            unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
            // SAFETY: `ptr` came from mimalloc with `layout`; the caller's contract holds.
            unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
        }
    }

    /// Makes the counters visible on `/metrics`.
    pub(crate) fn register() {
        qweb_server::process_counters::register(vec![
            qweb_server::process_counters::ProcessCounter {
                name: "qweb_allocations",
                help: "Heap allocations (and reallocations) since start (alloc-count builds only).",
                read: || ALLOCS.load(Ordering::Relaxed),
            },
            qweb_server::process_counters::ProcessCounter {
                name: "qweb_allocated_bytes",
                help: "Bytes asked of the heap since start (alloc-count builds only).",
                read: || BYTES.load(Ordering::Relaxed),
            },
        ]);
    }
}

/// The running profiler, when `QWEB_PROFILE` names an output file.
#[cfg(feature = "profile")]
pub(crate) struct Profiler {
    guard: pprof::ProfilerGuard<'static>,
    out: std::path::PathBuf,
}

#[cfg(feature = "profile")]
impl Profiler {
    /// Starts sampling when `QWEB_PROFILE` is set.
    pub(crate) fn from_env() -> Option<Profiler> {
        let out = std::path::PathBuf::from(std::env::var_os("QWEB_PROFILE")?);
        let hz = std::env::var("QWEB_PROFILE_HZ")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(499);
        match pprof::ProfilerGuardBuilder::default()
            .frequency(hz)
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
        {
            Ok(guard) => {
                eprintln!("qweb: profiling at {hz} Hz into {}", out.display());
                Some(Profiler { guard, out })
            }
            Err(e) => {
                eprintln!("qweb: cannot start the profiler: {e}");
                None
            }
        }
    }

    /// Writes the flame graph and the folded stacks.
    pub(crate) fn finish(self) {
        let report = match self.guard.report().build() {
            Ok(r) => r,
            Err(e) => {
                eprintln!("qweb: profile report failed: {e}");
                return;
            }
        };
        let mut folded = String::new();
        for (frames, count) in &report.data {
            let mut names: Vec<String> = Vec::new();
            for f in frames.frames.iter().rev() {
                for s in f.iter().rev() {
                    names.push(s.name());
                }
            }
            folded.push_str(&format!(
                "{};{} {count}\n",
                frames.thread_name,
                names.join(";")
            ));
        }
        let folded_path = self.out.with_extension("svg.folded");
        if let Err(e) = std::fs::write(&folded_path, folded) {
            eprintln!("qweb: cannot write {}: {e}", folded_path.display());
        }
        match std::fs::File::create(&self.out) {
            Ok(f) => match report.flamegraph(f) {
                Ok(()) => eprintln!("qweb: profile written to {}", self.out.display()),
                Err(e) => eprintln!("qweb: flame graph failed: {e}"),
            },
            Err(e) => eprintln!("qweb: cannot write {}: {e}", self.out.display()),
        }
    }
}
