//! The Redis key and channel names of one lock (the table in the [module docs](super)).

/// The Redis names of one lock.
pub(super) struct LockKeys {
    pub(super) holders: String,
    pub(super) tokens: String,
    pub(super) fence: String,
    pub(super) queue: String,
    pub(super) beats: String,
    pub(super) seq: String,
    pub(super) waits: String,
    pub(super) meta: String,
    pub(super) delay: String,
    pub(super) channel: String,
}

impl LockKeys {
    pub(super) fn new(prefix: &str, key: &str) -> Self {
        let mut tag = String::with_capacity(key.len() + 2);
        for c in key.chars() {
            match c {
                '%' => tag.push_str("%25"),
                '{' => tag.push_str("%7B"),
                '}' => tag.push_str("%7D"),
                other => tag.push(other),
            }
        }
        let name = |suffix: &str| format!("{prefix}{{{tag}}}:{suffix}");
        LockKeys {
            holders: name("holders"),
            tokens: name("tokens"),
            fence: name("fence"),
            queue: name("queue"),
            beats: name("beats"),
            seq: name("seq"),
            waits: name("waits"),
            meta: name("meta"),
            delay: name("delay"),
            channel: name("wake"),
        }
    }

    /// The keys every script is passed, in the order the scripts' prelude names them.
    pub(super) fn all(&self) -> [&str; 9] {
        [
            &self.holders,
            &self.tokens,
            &self.fence,
            &self.queue,
            &self.beats,
            &self.seq,
            &self.waits,
            &self.meta,
            &self.delay,
        ]
    }
}
