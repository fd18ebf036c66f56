//! A runtime of its own whose blocking threads do one kind of work
//! (`serve`'s one-shot requests, the ends and large reads of tunnels,
//! password checks), so that one kind cannot take another's threads.

use std::time::Duration;

use crate::Error;

/// A runtime whose blocking threads do one kind of work only (ending
/// tunnels, one-shot requests, password checks). Shut down without waiting
/// when the server goes, which may be on an async worker (where dropping a
/// runtime would panic).
pub(crate) struct Pool {
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
}

impl Pool {
    pub(crate) fn start(threads: usize, name: &str) -> Result<Pool, Error> {
        // Only its blocking pool is used, which needs no scheduler thread.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(threads)
            .thread_name(name)
            .build()
            .map_err(|e| Error::io(&format!("cannot start the {name} threads"), e))?;
        Ok(Pool { handle: runtime.handle().clone(), runtime: Some(runtime) })
    }

    pub(crate) fn handle(&self) -> tokio::runtime::Handle {
        self.handle.clone()
    }

    /// Waits at most `timeout` for the work running on the pool, then lets
    /// the rest go. Only outside an async context.
    pub(crate) fn shut_down(mut self, timeout: Duration) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(timeout);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

