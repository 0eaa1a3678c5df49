//! Jobs: synchronous code run on a stackful coroutine so that an offload inside it can pause
//! it (OpenSSL's `ASYNC_JOB` / `ASYNC_pause_job`, rebuilt on `corosensei`).
//!
//! The outer (async) code starts a job with [`Job::start`]. Code inside the job that wants an
//! op done calls [`pause`] with it: the job suspends and the outer code gets
//! [`Step::Paused`] with the op. The outer code has the op executed however it likes (awaits an
//! engine, with a timeout) and calls [`Job::resume`] with the result, which `pause` returns
//! inside the job. Outside a job, `pause` hands the op back and the caller does the work
//! itself (sync offload).
//!
//! Invariants:
//! - a job is resumed only on the thread that started it (`Job` is `!Send`);
//! - the thread's "current job" is swapped on every start, suspend, resume and return, so a
//!   job that starts and finishes while another is paused never sees the other's state;
//! - a panic inside a job ends that job with [`Step::Done`]`(Err(..))`, not the thread;
//! - dropping a paused job unwinds its stack (running its destructors) and returns the stack
//!   to this thread's pool;
//! - stacks are pooled per thread, and the number of live jobs per thread is bounded: past the
//!   bound, [`Job::start`] runs the function directly (any `pause` inside then falls back to
//!   the caller doing the op synchronously).

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};

use crate::op::{Op, OpError, OpResult};

/// Stack size of a job. Memory is committed lazily; the guard page catches overflow.
pub const STACK_SIZE: usize = 256 * 1024;
/// Idle stacks kept per thread.
const POOL_MAX: usize = 64;

type JobYielder = Yielder<Option<OpResult>, Op>;

thread_local! {
    static CURRENT: Cell<*const JobYielder> = const { Cell::new(std::ptr::null()) };
    static STACKS: RefCell<Vec<DefaultStack>> = const { RefCell::new(Vec::new()) };
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static MAX_LIVE: Cell<usize> = const { Cell::new(4096) };
}

/// Sets the most jobs that may be live at once on this thread (default 4096).
pub fn set_max_live(n: usize) {
    MAX_LIVE.with(|m| m.set(n.max(1)));
}

/// Jobs live (started, not finished or dropped) on this thread.
pub fn live() -> usize {
    LIVE.with(Cell::get)
}

/// Idle stacks pooled on this thread.
pub fn pooled_stacks() -> usize {
    STACKS.with(|s| s.borrow().len())
}

/// Is the calling code running inside a job?
pub fn in_job() -> bool {
    !CURRENT.with(Cell::get).is_null()
}

/// Pauses the current job until the op's result is supplied by [`Job::resume`]. Outside a job,
/// returns `Err(op)`: the caller must do the op itself.
pub fn pause(op: Op) -> Result<OpResult, Op> {
    let y = CURRENT.with(Cell::get);
    if y.is_null() {
        return Err(op);
    }
    #[allow(unsafe_code)]
    // SAFETY: CURRENT is non-null only while the coroutine whose yielder it points to is
    // running on this thread: the coroutine body sets it when it starts and after every
    // suspend returns, and the resumer restores its own value as soon as `resume` returns
    // (on suspend, return or unwind). So we are executing on that coroutine's stack right now
    // and the yielder, which lives on that stack for the whole body, is valid.
    let yielder = unsafe { &*y };
    let input = yielder.suspend(op);
    CURRENT.with(|c| c.set(y));
    Ok(input.unwrap_or(Err(OpError::Dropped)))
}

/// A step of a job.
pub enum Step<R> {
    /// The job paused and wants this op done.
    Paused(Op),
    /// The job finished; `Err` holds the payload of a panic inside it.
    Done(std::thread::Result<R>),
}

/// A job returning `R`.
pub struct Job<R> {
    co: Option<Coroutine<Option<OpResult>, Op, std::thread::Result<R>, DefaultStack>>,
    /// Counted in LIVE.
    counted: bool,
}

impl<R: 'static> Job<R> {
    /// Starts `f` as a job and runs it until it pauses or finishes.
    pub fn start<F>(f: F) -> (Job<R>, Step<R>)
    where
        F: FnOnce() -> R + 'static,
    {
        let over = LIVE.with(Cell::get) >= MAX_LIVE.with(Cell::get);
        let stack = if over {
            None
        } else {
            STACKS
                .with(|s| s.borrow_mut().pop())
                .or_else(|| DefaultStack::new(STACK_SIZE).ok())
        };
        let Some(stack) = stack else {
            // At the bound (or out of memory for stacks): run it right here, not as a job.
            let r = catch_unwind(AssertUnwindSafe(f));
            return (
                Job {
                    co: None,
                    counted: false,
                },
                Step::Done(r),
            );
        };
        let co = Coroutine::with_stack(stack, move |y: &JobYielder, _: Option<OpResult>| {
            CURRENT.with(|c| c.set(y as *const JobYielder));
            catch_unwind(AssertUnwindSafe(f))
        });
        LIVE.with(|l| l.set(l.get() + 1));
        let mut job = Job {
            co: Some(co),
            counted: true,
        };
        let step = job.step(None);
        (job, step)
    }

    /// Resumes a paused job with its op's result. Resuming a finished job returns
    /// `Done(Err(..))`.
    pub fn resume(&mut self, result: OpResult) -> Step<R> {
        self.step(Some(result))
    }

    fn step(&mut self, input: Option<OpResult>) -> Step<R> {
        let Some(co) = self.co.as_mut() else {
            return Step::Done(Err(Box::new("job already finished")));
        };
        if co.done() {
            return Step::Done(Err(Box::new("job already finished")));
        }
        let saved = CURRENT.with(Cell::get);
        let r = co.resume(input);
        CURRENT.with(|c| c.set(saved));
        match r {
            CoroutineResult::Yield(op) => Step::Paused(op),
            CoroutineResult::Return(r) => {
                self.recycle();
                Step::Done(r)
            }
        }
    }

    /// Has the job finished?
    pub fn is_done(&self) -> bool {
        self.co.as_ref().is_none_or(|c| c.done())
    }
}

impl<R> Job<R> {
    /// Gives a finished coroutine's stack back to the pool.
    fn recycle(&mut self) {
        if let Some(co) = self.co.take() {
            if co.done() {
                let stack = co.into_stack();
                STACKS.with(|s| {
                    let mut s = s.borrow_mut();
                    if s.len() < POOL_MAX {
                        s.push(stack);
                    }
                });
            }
        }
        if self.counted {
            self.counted = false;
            LIVE.with(|l| l.set(l.get() - 1));
        }
    }
}

impl<R> Drop for Job<R> {
    fn drop(&mut self) {
        if let Some(co) = self.co.as_mut() {
            if !co.done() {
                // Unwind the paused job's stack so everything on it is dropped.
                let saved = CURRENT.with(Cell::get);
                co.force_unwind();
                CURRENT.with(|c| c.set(saved));
            }
        }
        self.recycle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{OpOutput, SignOp, SignScheme};
    use std::rc::Rc;
    use std::sync::Arc;

    fn op(tag: u8) -> Op {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        Op::Sign(SignOp {
            key: crate::KeyRef {
                id: crate::KeyId([0; 32]),
                local: Some(Arc::new(
                    crate::LocalKey::from_der(&kp.serialize_der()).unwrap(),
                )),
            },
            scheme: SignScheme::EcdsaP256Sha256,
            message: vec![tag],
        })
    }

    fn msg(op: &Op) -> u8 {
        match op {
            Op::Sign(s) => s.message[0],
            Op::Compress(_) | Op::Check(_) => 0,
        }
    }

    fn sig(n: u8) -> OpResult {
        Ok(OpOutput::Signature(vec![n]))
    }

    #[test]
    fn pause_outside_a_job_hands_the_op_back() {
        assert!(!in_job());
        assert!(pause(op(1)).is_err());
    }

    #[test]
    fn pause_and_resume_in_order() {
        let (mut job, step) = Job::start(|| {
            assert!(in_job());
            let a = pause(op(1)).unwrap();
            let b = pause(op(2)).unwrap();
            (a, b)
        });
        assert!(!in_job(), "current job must be cleared on suspend");
        let Step::Paused(o) = step else {
            panic!("not paused")
        };
        assert_eq!(msg(&o), 1);
        let Step::Paused(o) = job.resume(sig(10)) else {
            panic!("not paused")
        };
        assert_eq!(msg(&o), 2);
        let Step::Done(Ok((a, b))) = job.resume(sig(20)) else {
            panic!("not done")
        };
        assert_eq!((a, b), (sig(10), sig(20)));
        assert!(job.is_done());
        assert!(matches!(job.resume(sig(0)), Step::Done(Err(_))));
    }

    #[test]
    fn interleaved_jobs_keep_their_own_state() {
        // Job B starts and finishes while job A is paused; A then resumes correctly.
        let (mut a, step) = Job::start(|| pause(op(1)).unwrap());
        assert!(matches!(step, Step::Paused(_)));
        let (mut b, step) = Job::start(|| pause(op(2)).unwrap());
        assert!(matches!(step, Step::Paused(ref o) if msg(o) == 2));
        let Step::Done(Ok(rb)) = b.resume(sig(2)) else {
            panic!()
        };
        assert_eq!(rb, sig(2));
        assert!(!in_job());
        let Step::Done(Ok(ra)) = a.resume(sig(1)) else {
            panic!()
        };
        assert_eq!(ra, sig(1));
    }

    #[test]
    fn panic_inside_a_job_is_contained() {
        let (mut job, step) = Job::start(|| {
            let _ = pause(op(1));
            panic!("boom");
        });
        assert!(matches!(step, Step::Paused(_)));
        let Step::Done(Err(payload)) = job.resume(sig(1)) else {
            panic!("panic escaped")
        };
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom"));
        assert!(!in_job());
    }

    #[test]
    fn dropping_a_paused_job_frees_it_and_runs_destructors() {
        struct Flag(Rc<Cell<bool>>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.set(true);
            }
        }
        let before = live();
        let dropped = Rc::new(Cell::new(false));
        let f = Flag(dropped.clone());
        let (job, step) = Job::start(move || {
            let _keep = f;
            let _ = pause(op(1));
        });
        assert!(matches!(step, Step::Paused(_)));
        assert_eq!(live(), before + 1);
        drop(job);
        assert!(dropped.get(), "the job's stack was not unwound");
        assert_eq!(live(), before);
        assert!(pooled_stacks() >= 1, "stack not returned to the pool");
        assert!(!in_job());
    }

    #[test]
    fn past_the_bound_jobs_run_directly() {
        set_max_live(1);
        let (_a, step) = Job::start(|| pause(op(1)).is_ok());
        assert!(matches!(step, Step::Paused(_)));
        // the second cannot get a coroutine: it runs directly and `pause` hands the op back
        let (_b, step) = Job::start(|| pause(op(2)).is_ok());
        assert!(matches!(step, Step::Done(Ok(false))));
        set_max_live(4096);
    }

    #[test]
    fn stacks_are_reused() {
        for _ in 0..3 {
            let (mut j, _) = Job::start(|| pause(op(1)).unwrap());
            assert!(matches!(j.resume(sig(1)), Step::Done(Ok(_))));
        }
        assert!(pooled_stacks() >= 1 && pooled_stacks() <= POOL_MAX);
    }
}
