//! `try_acquire` never waits: busy is `None`. Retrying it by hand, with a bound, as a job that
//! would rather skip than queue does; and the same with the retry policy doing the waiting.
//!
//! `cargo run -p turnstile-lock --example try_lock [redis://127.0.0.1:6379]`

mod common;

use std::time::Duration;

use turnstile_lock::{LockError, Locker, RetryPolicy};

/// What happened to the two attempts made while another task held the lock for 200 ms.
#[derive(Debug, PartialEq)]
struct Outcome {
    /// `try_acquire` at once, while held: busy.
    busy_at_once: bool,
    /// Tries every 50 ms for up to 2 s: granted once the holder let go.
    granted_after_retries: bool,
    /// `acquire` with a 50 ms total time while held: timed out.
    timed_out: bool,
}

async fn run(locker: &Locker) -> Result<Outcome, LockError> {
    let request = locker.lock("nightly-report", Duration::from_secs(10));
    let holder = request.acquire().await?;
    let busy_at_once = request.try_acquire().await?.is_none();
    let timed_out = matches!(
        locker
            .lock("nightly-report", Duration::from_secs(10))
            .retry(RetryPolicy::new().total_time(Duration::from_millis(50)))
            .acquire()
            .await,
        Err(LockError::Timeout { .. })
    );
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        holder.release().await
    });
    let mut granted_after_retries = false;
    for _ in 0..40 {
        if let Some(lock) = request.try_acquire().await? {
            lock.release().await?;
            granted_after_retries = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Outcome {
        busy_at_once,
        granted_after_retries,
        timed_out,
    })
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let locker = common::locker_from_args().await?;
    println!("{:?}", run(&locker).await?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn busy_at_once_then_granted_and_a_bounded_wait_times_out() {
        common::on_every_backend(|locker| async move {
            let outcome = run(&locker).await.expect("run");
            assert_eq!(
                outcome,
                Outcome {
                    busy_at_once: true,
                    granted_after_retries: true,
                    timed_out: true,
                }
            );
        })
        .await;
    }
}
