//! The one way the runner and its hosts try a call again: after each of a list of waits, while
//! the call's error says it may pass (the `backon` crate does the trying). A stop (the job's
//! deadline, a shutdown, a lost lease) cuts a wait short and limits the tries left.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use backon::Retryable;
use tokio_util::sync::CancellationToken;

/// When to try again: the waits between tries, and what cuts them short.
#[derive(Clone, Copy, Debug)]
pub struct Tries<'a> {
    /// Waited in turn between tries: one try more than waits, at most.
    pub waits: &'a [Duration],
    /// Cuts a wait short once fired.
    pub stop: Option<&'a CancellationToken>,
    /// Tries made in all, at most, once `stop` has fired.
    pub once_stopped: usize,
}

impl<'a> Tries<'a> {
    /// Tries after each of `waits`, whatever happens meanwhile.
    pub fn after(waits: &'a [Duration]) -> Self {
        Self {
            waits,
            stop: None,
            once_stopped: usize::MAX,
        }
    }

    /// Waits cut short by `stop`; once it has fired, `tries` tries in all (the one made
    /// included), without waiting.
    #[must_use]
    pub fn until(mut self, stop: &'a CancellationToken, tries: usize) -> Self {
        self.stop = Some(stop);
        self.once_stopped = tries;
        self
    }

    /// Calls `op` until it succeeds, its error is not one `again` accepts, or the tries run
    /// out; the last try's answer. Each try that will be followed by another is logged with
    /// `what` and its error.
    ///
    /// # Errors
    /// The last try's error.
    pub async fn run<T, E, Fut>(
        self,
        what: &str,
        mut again: impl FnMut(&E) -> bool,
        mut op: impl FnMut() -> Fut,
    ) -> Result<T, E>
    where
        Fut: Future<Output = Result<T, E>>,
        E: std::fmt::Display,
    {
        let tried = AtomicUsize::new(0);
        let stop = self.stop.cloned();
        let sleep_stop = stop.clone();
        let counted = || {
            tried.fetch_add(1, Ordering::Relaxed);
            op()
        };
        counted
            .retry(self.waits.iter().copied())
            .sleep(move |wait| {
                let stop = sleep_stop.clone();
                async move {
                    match stop {
                        Some(stop) => {
                            tokio::select! {
                                () = tokio::time::sleep(wait) => {}
                                () = stop.cancelled() => {}
                            }
                        }
                        None => tokio::time::sleep(wait).await,
                    }
                }
            })
            .when(|e| {
                let stopped = stop.as_ref().is_some_and(CancellationToken::is_cancelled);
                again(e) && !(stopped && tried.load(Ordering::Relaxed) >= self.once_stopped)
            })
            .notify(|e, wait| tracing::warn!(error = %e, "{what}; trying again in {wait:?}"))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    const WAITS: [Duration; 3] = [
        Duration::from_secs(1),
        Duration::from_secs(2),
        Duration::from_secs(4),
    ];

    /// An operation failing its first `failures` tries, counting them.
    fn failing(
        failures: u32,
        tries: &AtomicU32,
    ) -> impl FnMut() -> std::future::Ready<Result<u32, String>> + '_ {
        move || {
            let n = tries.fetch_add(1, Ordering::Relaxed) + 1;
            std::future::ready(if n > failures {
                Ok(n)
            } else {
                Err(format!("failure {n}"))
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_fails_for_a_while_is_tried_after_each_wait_until_it_succeeds() {
        let tries = AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let got = Tries::after(&WAITS)
            .run("test", |_| true, failing(2, &tries))
            .await;
        assert_eq!(got, Ok(3));
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(3),
            "waited 1 s, then 2 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_keeps_failing_gives_up_with_its_last_error_once_the_waits_run_out() {
        let tries = AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let got = Tries::after(&WAITS)
            .run("test", |_| true, failing(10, &tries))
            .await;
        assert_eq!(got, Err("failure 4".into()));
        assert_eq!(tries.load(Ordering::Relaxed), 4, "one more try than waits");
        assert_eq!(started.elapsed(), Duration::from_secs(7));
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_that_will_not_pass_is_not_tried_again() {
        let tries = AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let got = Tries::after(&WAITS)
            .run("test", |e: &String| e != "failure 1", failing(10, &tries))
            .await;
        assert_eq!(got, Err("failure 1".into()));
        assert_eq!(tries.load(Ordering::Relaxed), 1);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_cuts_the_wait_short_and_limits_the_tries_left() {
        let stop = CancellationToken::new();
        let tries = AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let stopper = {
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(500)).await;
                stop.cancel();
            })
        };
        let got = Tries::after(&WAITS)
            .until(&stop, 3)
            .run("test", |_| true, failing(10, &tries))
            .await;
        stopper.await.unwrap();
        assert_eq!(got, Err("failure 3".into()));
        assert_eq!(
            tries.load(Ordering::Relaxed),
            3,
            "three tries in all once stopped"
        );
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(500),
            "the first wait cut short, the next not waited"
        );
    }
}
