//! Wake-ups of a lock's pass that no watch event brings: its backend answers again
//! (`backend_outages`), or another lock of a claim it is first for now admits that claim
//! (`multi_lock`). Fed to the lock controller with `Controller::reconcile_on`.

use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use kube::runtime::reflector::ObjectRef;

use turnstile_api::DistributedLock;

type Receiver = mpsc::UnboundedReceiver<ObjectRef<DistributedLock>>;

/// The sending side, and the receiving side until the controller takes it. Clones share both.
#[derive(Debug, Clone)]
pub struct LockWakes {
    sender: mpsc::UnboundedSender<ObjectRef<DistributedLock>>,
    receiver: Arc<Mutex<Option<Receiver>>>,
}

impl Default for LockWakes {
    fn default() -> Self {
        let (sender, receiver) = mpsc::unbounded();
        Self {
            sender,
            receiver: Arc::new(Mutex::new(Some(receiver))),
        }
    }
}

impl LockWakes {
    /// Runs a pass of `lock` soon (kube-runtime folds it into one already due).
    pub fn wake(&self, lock: ObjectRef<DistributedLock>) {
        // Closed only once the controller stopped: nobody is left to wake.
        let _ = self.sender.unbounded_send(lock);
    }

    /// The stream of wake-ups, for the controller; `None` once taken.
    pub fn take_stream(&self) -> Option<Receiver> {
        self.receiver
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }
}
