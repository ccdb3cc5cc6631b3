//! The lock engine: mutexes and counting semaphores over pluggable backends.
