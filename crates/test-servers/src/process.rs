//! Helpers shared by every launcher: free ports, readiness polling, kill-by-PID on drop.

use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// A port that was free on 127.0.0.1 a moment ago (the OS picked it). Another process may
/// still take it before the server binds: launchers retry on a fresh port when that happens.
pub fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

/// Polls `ready` every 10 ms until it returns true or `timeout` elapses. Returns whether it
/// became ready.
pub fn wait_until(timeout: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The instance in `slot` while some user still holds it, else a new one from `start`. The
/// slot keeps it only weakly, so it stops when its last user drops it.
pub fn shared_instance<T>(
    slot: &Mutex<Weak<T>>,
    start: impl FnOnce() -> io::Result<T>,
) -> io::Result<Arc<T>> {
    let mut shared = slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(instance) = shared.upgrade() {
        return Ok(instance);
    }
    let instance = Arc::new(start()?);
    *shared = Arc::downgrade(&instance);
    Ok(instance)
}

/// A spawned server process, killed (by its PID) and reaped when dropped.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
}

impl ServerProcess {
    /// Spawns `command` with stdin closed and output discarded.
    pub fn spawn(mut command: Command) -> io::Result<Self> {
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        Ok(ServerProcess { child })
    }

    /// Spawns `command` with stdin closed and its output (standard output and error) appended
    /// to the file `log`, kept for a failing test to read.
    pub fn spawn_logged(mut command: Command, log: &std::path::Path) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()?;
        Ok(ServerProcess { child })
    }

    /// Lets the process run on after this value is gone (whoever holds its PID stops it).
    pub fn forget(self) {
        std::mem::forget(self);
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True if the process already exited (e.g. it could not bind its port).
    pub fn has_exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills the process and waits for it.
    pub fn stop(&mut self) {
        // `Child::kill` signals exactly this PID (SIGKILL); an already-exited child is fine.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}
