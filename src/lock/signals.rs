//! The termination signals `turnstile lock` catches (SIGTERM, SIGINT) so that it can pass them
//! on to the command, or leave the lock's queue cleanly while still waiting.

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, Signal as SignalStream, SignalKind};

/// SIGTERM and SIGINT, caught from the moment this is created (the default action, dying on
/// the spot without releasing anything, no longer applies).
#[derive(Debug)]
pub struct TerminationSignals {
    terminate: SignalStream,
    interrupt: SignalStream,
}

impl TerminationSignals {
    /// Starts catching SIGTERM and SIGINT.
    pub fn catch() -> std::io::Result<Self> {
        Ok(TerminationSignals {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    /// The next signal received. Never completes if the signal streams end (they do not
    /// while the runtime lives).
    pub async fn recv(&mut self) -> Signal {
        loop {
            tokio::select! {
                Some(()) = self.terminate.recv() => return Signal::SIGTERM,
                Some(()) = self.interrupt.recv() => return Signal::SIGINT,
                else => std::future::pending::<()>().await,
            }
        }
    }
}
