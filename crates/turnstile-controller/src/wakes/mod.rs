//! Lock passes woken by something other than a watch event on the lock or its claims, each
//! fed to the lock controller (`Controller::reconcile_on`):
//!
//! - [`lock_wakes`]: the channel they all use;
//! - [`backend_outages`]: a backend that answers again wakes the locks that waited for it;
//! - [`queue_wakes`]: a backend that hands a key shared with another cluster to a claim
//!   waiting in its queue wakes that claim's lock;
//! - [`owner_watch`]: Pod and Job events wake the locks of the claims they own.

pub mod backend_outages;
pub mod lock_wakes;
pub mod owner_watch;
pub mod queue_wakes;
