//! The shared register the workers read, modify and write under a mutex: a stand-in for the
//! storage a lock protects. Fenced, it behaves like a storage system that checks the fencing
//! token on every request: it remembers the highest token it has seen (on reads and writes)
//! and refuses any request with a lower one. Unfenced (the control run), it takes every write.

use std::sync::{Arc, Mutex};

use super::history::{Event, History};

#[derive(Debug, Default)]
struct State {
    value: u64,
    highest_token: i64,
}

/// One lock's register.
#[derive(Debug, Clone)]
pub struct Register {
    lock: String,
    fenced: bool,
    state: Arc<Mutex<State>>,
    history: History,
}

impl Register {
    /// An empty register for `lock`; `fenced` says whether it checks tokens.
    pub fn new(lock: &str, fenced: bool, history: History) -> Self {
        Self {
            lock: lock.to_owned(),
            fenced,
            state: Arc::default(),
            history,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether a fenced register takes `token` now (raising its high-water mark if so).
    fn admits(&self, state: &mut State, token: i64) -> bool {
        if self.fenced && token < state.highest_token {
            return false;
        }
        state.highest_token = state.highest_token.max(token);
        true
    }

    /// Reads the value with `token`; None if refused.
    pub fn read(&self, claim: &str, token: i64) -> Option<u64> {
        let value = {
            let mut state = self.state();
            self.admits(&mut state, token).then_some(state.value)
        };
        self.history.record(Event::Read {
            lock: self.lock.clone(),
            claim: claim.to_owned(),
            token,
            value,
        });
        value
    }

    /// Writes `read + 1` with `token`; returns whether it was accepted.
    pub fn write_next(&self, claim: &str, token: i64, read: u64) -> bool {
        let (previous, accepted) = {
            let mut state = self.state();
            let previous = state.value;
            let accepted = self.admits(&mut state, token);
            if accepted {
                state.value = read + 1;
            }
            (previous, accepted)
        };
        self.history.record(Event::Write {
            lock: self.lock.clone(),
            claim: claim.to_owned(),
            token,
            read,
            previous,
            new: read + 1,
            accepted,
        });
        accepted
    }
}

#[test]
fn a_fenced_register_refuses_tokens_below_the_highest_seen() {
    let register = Register::new("m", true, History::default());
    assert_eq!(register.read("a", 1), Some(0));
    assert_eq!(register.read("b", 2), Some(0));
    assert!(!register.write_next("a", 1, 0), "a stale token is refused");
    assert!(register.write_next("b", 2, 0));
    assert_eq!(register.read("a", 1), None);
}

#[test]
fn an_unfenced_register_takes_every_write() {
    let register = Register::new("m", false, History::default());
    assert_eq!(register.read("b", 2), Some(0));
    assert!(register.write_next("b", 2, 0));
    assert!(
        register.write_next("a", 1, 0),
        "the stale write goes through"
    );
    assert_eq!(register.read("c", 3), Some(1), "b's update was lost");
}
