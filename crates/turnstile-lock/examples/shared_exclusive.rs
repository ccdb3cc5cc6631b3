//! A read/write lock: readers hold together (`shared`), a writer alone (`exclusive`), and a
//! waiting writer keeps later readers from overtaking it.
//!
//! `cargo run -p turnstile-lock --example shared_exclusive [redis://127.0.0.1:6379]`

mod common;

use std::time::Duration;

use turnstile_lock::{LockError, Locker};

/// The order things happened in, as labels.
async fn run(locker: &Locker) -> Result<Vec<&'static str>, LockError> {
    let table = |locker: &Locker| {
        locker
            .lock("orders-table", Duration::from_secs(10))
            .max_holders(4)
    };
    let reader_1 = table(locker).shared().acquire().await?;
    let reader_2 = table(locker).shared().acquire().await?;
    let mut order = vec!["two readers hold together"];

    let writer = tokio::spawn({
        let request = table(locker).exclusive();
        async move { request.acquire().await }
    });
    // Give the writer time to queue, then a third reader arrives behind it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let late_reader = table(locker).shared();
    if late_reader.try_acquire().await?.is_none() {
        order.push("a later reader waits behind the queued writer");
    }
    reader_1.release().await?;
    reader_2.release().await?;
    let writer = writer.await.expect("writer")?;
    order.push("the writer holds alone once the readers let go");
    writer.release().await?;
    let reader_3 = late_reader.acquire().await?;
    order.push("then the later reader");
    reader_3.release().await?;
    Ok(order)
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let locker = common::locker_from_args().await?;
    for step in run(&locker).await? {
        println!("{step}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_queued_writer_is_not_overtaken_by_later_readers() {
        common::on_every_backend(|locker| async move {
            assert_eq!(
                run(&locker).await.expect("run"),
                [
                    "two readers hold together",
                    "a later reader waits behind the queued writer",
                    "the writer holds alone once the readers let go",
                    "then the later reader",
                ]
            );
        })
        .await;
    }
}
