//! A counting semaphore: at most two of six jobs run at once.
//!
//! `cargo run -p turnstile-lock --example semaphore [redis://127.0.0.1:6379]`

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use turnstile_lock::{LockError, Locker};

/// Runs six jobs under a semaphore of two slots; returns the most that ran at once.
async fn run(locker: &Locker) -> Result<usize, LockError> {
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut jobs = Vec::new();
    for _ in 0..6 {
        let (locker, running, most) = (locker.clone(), running.clone(), most.clone());
        jobs.push(tokio::spawn(async move {
            locker
                .lock("build-slots", Duration::from_secs(10))
                .max_holders(2)
                .run(|_slot| async move {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                })
                .await
        }));
    }
    for job in jobs {
        job.await.expect("job")?;
    }
    Ok(most.load(Ordering::SeqCst))
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let locker = common::locker_from_args().await?;
    println!("at most {} of 6 jobs ran at once", run(&locker).await?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn two_jobs_run_at_once_never_more() {
        common::on_every_backend(|locker| async move {
            assert_eq!(run(&locker).await.expect("run"), 2);
        })
        .await;
    }
}
