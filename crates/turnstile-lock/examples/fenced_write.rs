//! A mutex around a critical section, with a fenced write: every write to the store carries
//! the lock's fencing token, and the store refuses a token lower than one it has seen. So a
//! holder that lost the lock (paused past its lease, say) cannot overwrite its successor.
//!
//! `cargo run -p turnstile-lock --example fenced_write [redis://127.0.0.1:6379]`

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use turnstile_lock::{LockError, Locker};

/// A store that keeps the highest fencing token it has seen and refuses older ones.
#[derive(Default)]
struct FencedStore {
    highest_token: u64,
    value: u64,
    refused: u32,
}

impl FencedStore {
    /// Writes `value` if `token` is not older than any write before it.
    fn write(&mut self, token: u64, value: u64) -> bool {
        if token < self.highest_token {
            self.refused += 1;
            return false;
        }
        self.highest_token = token;
        self.value = value;
        true
    }
}

/// Eight workers each add one to the stored value under the lock: read, then a fenced write.
/// Returns the final value and how many writes the store refused.
async fn run(locker: &Locker) -> Result<(u64, u32), LockError> {
    let store = Arc::new(Mutex::new(FencedStore::default()));
    let mut workers = Vec::new();
    for _ in 0..8 {
        let (locker, store) = (locker.clone(), store.clone());
        workers.push(tokio::spawn(async move {
            locker
                .lock("fenced-counter", Duration::from_secs(10))
                .run(|lock| async move {
                    let read = store.lock().expect("store").value;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    store
                        .lock()
                        .expect("store")
                        .write(lock.fencing_token(), read + 1)
                })
                .await
        }));
    }
    for worker in workers {
        worker.await.expect("worker")?;
    }
    let store = store.lock().expect("store");
    Ok((store.value, store.refused))
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let locker = common::locker_from_args().await?;
    let (value, refused) = run(&locker).await?;
    println!("value {value} after 8 locked increments; {refused} stale writes refused");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_increment_lands_and_no_write_is_refused() {
        common::on_every_backend(|locker| async move {
            assert_eq!(run(&locker).await.expect("run"), (8, 0));
        })
        .await;
    }

    #[test]
    fn the_store_refuses_a_stale_token() {
        let mut store = FencedStore::default();
        assert!(store.write(2, 1));
        assert!(!store.write(1, 5), "a holder that lost the lock");
        assert_eq!((store.value, store.refused), (1, 1));
    }
}
