//! The [`Waker`] a task (or a link thread) sleeps on when it can do nothing, and that producers,
//! consumers and the coordinator ring when it may have something to do.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A task's doorbell: producers, consumers and the coordinator ring it when the task may have
/// something to do; the task sleeps on it otherwise. Rings are counted, so none is lost between the
/// task's last look and its sleep.
///
/// A ring costs two atomic operations when the task is awake; only a sleeping task is signalled
/// through the mutex and condition variable. (Both sides use sequentially consistent operations: a
/// ringer that sees no sleeper rang before the sleeper looked at the count, so the sleeper sees it.)
#[derive(Default)]
pub(crate) struct Waker {
    rings: AtomicU64,
    sleepers: AtomicU64,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Waker {
    pub fn new() -> Arc<Waker> {
        Arc::new(Waker::default())
    }

    pub fn ring(&self) {
        self.rings.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            // Taking the lock orders this notification after a sleeper's check-then-wait.
            let _g = self.lock.lock().expect("waker");
            self.cv.notify_all();
        }
    }

    /// The current ring count: take it before looking for work, then [`Waker::sleep`] with it.
    pub fn rings(&self) -> u64 {
        self.rings.load(Ordering::SeqCst)
    }

    /// Sleep until a ring after `seen`, or `timeout`.
    pub fn sleep(&self, seen: u64, timeout: Duration) {
        let g = self.lock.lock().expect("waker");
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        if self.rings.load(Ordering::SeqCst) == seen {
            let _ =
                self.cv.wait_timeout_while(g, timeout, |_| self.rings.load(Ordering::SeqCst) == seen).expect("waker");
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}
