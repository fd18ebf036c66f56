//! A connection's task that wakes itself is polled again at once, on the
//! thread it runs on, instead of being handed back to the runtime.
//!
//! hyper reads a request body through a channel between its connection
//! task and the service, which runs inside that same task: taking the
//! body's bytes wakes the connection (the channel's sender) while it is
//! being polled. tokio's multi-thread scheduler treats a task woken during
//! its own poll as one that yielded: it puts it at the back of the queue
//! and wakes an idle worker to take it (a `write` to the I/O driver's
//! eventfd or a `futex`), which then steals the connection. At c=1 every
//! `POST` thus woke the other worker and moved between the two (seen with
//! `strace -f`: a `write(eventfd)` and an `epoll_wait` of the other worker
//! per append, none per `GET`), and cost about twice the CPU of a `GET`.
//!
//! [`Coalesced`] polls its future with a waker of its own: a wake that
//! comes while the future is being polled (from the task itself, or from
//! another thread at that moment) only marks it, and the future is polled
//! again before `poll` returns, up to [`REPOLLS`] times; after that the
//! wake goes to the runtime as before (a fair yield). A wake that comes
//! between polls goes to the runtime at once. Nothing is lost: every wake
//! is followed by a poll.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// How many times in a row a future that keeps waking itself is polled
/// again at once before its wake is handed to the runtime (hyper's own
/// loop yields after 16 rounds; this keeps a busy connection from holding
/// its worker much longer).
const REPOLLS: usize = 8;

/// The future is being polled.
const POLLING: u8 = 1;
/// It was woken while being polled.
const WOKEN: u8 = 2;

/// `future`, whose wakes during its own poll are coalesced into an
/// immediate poll (see the module documentation).
pub(crate) fn coalesced<F: Future>(future: F) -> Coalesced<F> {
    Coalesced { future: Box::pin(future), inner: Arc::new(Inner { state: AtomicU8::new(0), waker: Mutex::new(None) }) }
}

/// See [`coalesced`].
pub(crate) struct Coalesced<F> {
    future: Pin<Box<F>>,
    inner: Arc<Inner>,
}

struct Inner {
    state: AtomicU8,
    /// The runtime's waker of the task, as of its last poll.
    waker: Mutex<Option<Waker>>,
}

impl Wake for Inner {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // While polled: mark it, the poll goes round again.
        let marked = self.state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| (s & POLLING != 0).then_some(s | WOKEN)).is_ok();
        if marked {
            return;
        }
        let waker = self.waker.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<F: Future> Future for Coalesced<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        {
            let mut kept = this.inner.waker.lock().unwrap_or_else(|p| p.into_inner());
            if !kept.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *kept = Some(cx.waker().clone());
            }
        }
        let waker = Waker::from(this.inner.clone());
        let mut own = Context::from_waker(&waker);
        for _ in 0..REPOLLS {
            this.inner.state.store(POLLING, Ordering::Release);
            if let Poll::Ready(out) = this.future.as_mut().poll(&mut own) {
                this.inner.state.store(0, Ordering::Release);
                return Poll::Ready(out);
            }
            // Not woken meanwhile: done; a later wake goes to the runtime.
            if this.inner.state.compare_exchange(POLLING, 0, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                return Poll::Pending;
            }
        }
        // Still waking itself: let the runtime schedule it (a yield).
        this.inner.state.store(0, Ordering::Release);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts the wakes the runtime would see.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Wakes itself `n` times, then is ready.
    struct SelfWaking(usize);

    impl Future for SelfWaking {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.0 == 0 {
                return Poll::Ready(());
            }
            self.0 -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    #[test]
    fn a_wake_during_the_poll_is_an_immediate_poll_not_a_runtime_wake() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut f = std::pin::pin!(coalesced(SelfWaking(3)));
        assert!(f.as_mut().poll(&mut cx).is_ready());
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_future_that_keeps_waking_itself_yields_to_the_runtime() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut f = std::pin::pin!(coalesced(SelfWaking(REPOLLS + 1)));
        assert!(f.as_mut().poll(&mut cx).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(f.as_mut().poll(&mut cx).is_ready());
    }

    #[test]
    fn a_wake_between_polls_reaches_the_runtime() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let stored: Arc<Mutex<Option<Waker>>> = Arc::default();
        let s = stored.clone();
        let mut polls = 0;
        let mut f = std::pin::pin!(coalesced(std::future::poll_fn(move |cx| {
            polls += 1;
            if polls == 2 {
                return Poll::Ready(());
            }
            *s.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        })));
        assert!(f.as_mut().poll(&mut cx).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        // From "another thread", after the poll returned.
        stored.lock().unwrap().take().unwrap().wake();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(f.as_mut().poll(&mut cx).is_ready());
    }
}
