//! The command run under the lock: spawning it, passing signals on, stopping it when the
//! lock is lost, and turning its exit status into ours.
//!
//! When stdin is not a terminal (containers, CI, scripts) the command runs in its own process
//! group and signals go to the whole group, so stopping it also stops whatever it started
//! (`sh -c 'a; b'`): after a lost lock nothing of the critical section may keep running.
//! On a terminal the command stays in turnstile's foreground group, so interactive programs
//! keep working; there only the command itself is signalled.
//!
//! On Linux turnstile also becomes a child subreaper: processes the command leaves behind are
//! re-parented to turnstile, which reaps them while stopping the group. Otherwise they would
//! stay zombies wherever PID 1 does not reap (many containers), and a zombie still counts as
//! a member of the group.

use std::ffi::OsString;
use std::io::{self, IsTerminal};
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// How often a stop checks whether the rest of the command's process group is gone.
const GROUP_POLL: Duration = Duration::from_millis(50);

/// A running command.
#[derive(Debug)]
pub struct Supervised {
    child: Child,
    /// The command's pid (also its process group id when `own_group`).
    pid: Pid,
    own_group: bool,
}

/// How [`Supervised::stop`] ended the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// The command's exit status.
    pub status: ExitStatus,
    /// Whether SIGKILL had to follow SIGTERM because the grace period ran out.
    pub killed: bool,
}

impl Supervised {
    /// Starts `command` (program and arguments) with `env` added to turnstile's environment,
    /// sharing turnstile's stdin, stdout and stderr.
    pub fn spawn(command: &[OsString], env: &[(&str, String)]) -> io::Result<Self> {
        let Some((program, args)) = command.split_first() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no command given",
            ));
        };
        let own_group = !io::stdin().is_terminal();
        let mut builder = Command::new(program);
        builder
            .args(args)
            .envs(env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::inherit())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            // If turnstile itself dies, don't leave the critical section running unlocked.
            .kill_on_drop(true);
        if own_group {
            builder.process_group(0);
            become_subreaper();
        }
        let child = builder.spawn()?;
        let raw_pid = child
            .id()
            .ok_or_else(|| io::Error::other("the command exited before its pid was known"))?;
        let pid = i32::try_from(raw_pid)
            .map(Pid::from_raw)
            .map_err(|_| io::Error::other(format!("pid {raw_pid} out of range")))?;
        Ok(Supervised {
            child,
            pid,
            own_group,
        })
    }

    /// The command's process id.
    pub fn pid(&self) -> u32 {
        self.pid.as_raw().unsigned_abs()
    }

    /// Waits for the command to exit.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Sends `signal` to the command's process group when it has one (even after the command
    /// itself exited: what it started may still run), else to the command unless it exited.
    pub fn signal(&mut self, signal: Signal) {
        let sent = if self.own_group {
            // The kernel does not reuse a pid as a process id while a group of that id lives.
            killpg(self.pid, signal)
        } else if matches!(self.child.try_wait(), Ok(None)) {
            // `try_wait` reaps an exited command, so a live pid here is still the command's.
            kill(self.pid, signal)
        } else {
            return;
        };
        if let Err(error) = sent {
            tracing::debug!(pid = self.pid.as_raw(), %signal, %error, "could not signal the command");
        }
    }

    /// Stops the command: SIGTERM, then SIGKILL if it (or, with its own process group, anything
    /// it started) is still running after `grace`. Returns once the command has exited.
    pub async fn stop(&mut self, grace: Duration) -> io::Result<Stopped> {
        let deadline = Instant::now() + grace;
        self.signal(Signal::SIGTERM);
        let (status, mut killed) = match tokio::time::timeout_at(deadline, self.child.wait()).await
        {
            Ok(status) => (status?, false),
            Err(_) => {
                self.signal(Signal::SIGKILL);
                (self.child.wait().await?, true)
            }
        };
        if self.own_group {
            // The command is gone; what it started must go too, within the same grace period.
            while reap_and_check_group(self.pid) && Instant::now() < deadline {
                tokio::time::sleep(GROUP_POLL).await;
            }
            if reap_and_check_group(self.pid) {
                if let Err(error) = killpg(self.pid, Signal::SIGKILL) {
                    tracing::debug!(pgid = self.pid.as_raw(), %error, "could not kill the command's process group");
                }
                killed = true;
                // Bounded: SIGKILL cannot be caught; give the kernel a moment, then move on.
                for _ in 0..20 {
                    if !reap_and_check_group(self.pid) {
                        break;
                    }
                    tokio::time::sleep(GROUP_POLL).await;
                }
            }
        }
        Ok(Stopped { status, killed })
    }
}

/// Reaps the group's members that were re-parented to us and exited, then says whether any
/// process is left in process group `pgid` (zombies count until someone reaps them). Only
/// called after the command itself was reaped, so this never takes its status from tokio.
fn reap_and_check_group(pgid: Pid) -> bool {
    let members = Pid::from_raw(-pgid.as_raw());
    while let Ok(status) = waitpid(members, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
    killpg(pgid, None::<Signal>).is_ok()
}

/// Makes orphans of the command our children (Linux), so that we can reap them.
fn become_subreaper() {
    #[cfg(target_os = "linux")]
    if let Err(error) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::debug!(%error, "cannot become a child subreaper; orphans of the command go to PID 1");
    }
}

/// The exit code a shell would report for `status`: the command's own code, or 128 + N if
/// signal N killed it.
pub fn shell_exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(u8::MAX),
        (None, Some(signal)) => signal_exit_code(signal),
        (None, None) => u8::MAX,
    }
}

/// 128 + `signal`, as shells report a death by that signal.
pub fn signal_exit_code(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(u8::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(shell_exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(shell_exit_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(shell_exit_code(ExitStatus::from_raw(255 << 8)), 255);
        // Killed by SIGTERM (15) / SIGKILL (9): raw wait status is the signal number.
        assert_eq!(shell_exit_code(ExitStatus::from_raw(15)), 143);
        assert_eq!(shell_exit_code(ExitStatus::from_raw(9)), 137);
    }
}
