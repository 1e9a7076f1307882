//! The bounded queue: `max_concurrent` queries run at once, `queue` more
//! wait for a turn, and a request beyond both is answered 429 at once.
//!
//! A ticket is taken when the request arrives and held until its query
//! ends (for a stream, until the last token, not when the response
//! headers go out), so the bound counts the queries the servers are
//! actually running for this gateway.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Admission: running plus waiting, at most `bound`.
#[derive(Debug)]
pub struct Admit {
    running: Arc<Semaphore>,
    admitted: AtomicUsize,
    bound: usize,
}

/// A request's place: in the queue, then running once [`Ticket::turn`]
/// returns. Dropping it gives the place back.
#[derive(Debug)]
pub struct Ticket {
    admit: Arc<Admit>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Admit {
    /// `max_concurrent` running (at least 1) and `queue` waiting.
    pub fn new(max_concurrent: usize, queue: usize) -> Arc<Admit> {
        let running = max_concurrent.max(1);
        Arc::new(Admit {
            running: Arc::new(Semaphore::new(running)),
            admitted: AtomicUsize::new(0),
            bound: running.saturating_add(queue),
        })
    }

    /// Running plus waiting, at most.
    pub fn bound(&self) -> usize {
        self.bound
    }

    /// A place, or `None` when the queue is full.
    pub fn enter(self: &Arc<Self>) -> Option<Ticket> {
        let taken = self
            .admitted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.bound).then_some(n + 1)
            });
        taken.ok().map(|_| Ticket {
            admit: self.clone(),
            permit: None,
        })
    }
}

impl Ticket {
    /// Waits for a turn to run.
    pub async fn turn(&mut self) {
        if self.permit.is_none() {
            // The semaphore is never closed, so acquiring only waits.
            self.permit = self.admit.running.clone().acquire_owned().await.ok();
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.permit.take();
        self.admit.admitted.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_running_and_waiting_there_is_no_place_until_one_is_given_back() {
        let admit = Admit::new(1, 1);
        let a = admit.enter();
        let b = admit.enter();
        assert!(a.is_some() && b.is_some());
        assert!(admit.enter().is_none());
        drop(a);
        assert!(admit.enter().is_some());
    }
}
