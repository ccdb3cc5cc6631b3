//! The custom resources: `DistributedLock` and `LockClaim` in `turnstile.dev/v1alpha1`.
