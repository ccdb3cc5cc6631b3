//! Test hooks: injected faults and the request log.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One request as the server saw it, with its Kubernetes request attributes
/// (what RBAC would authorise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// HTTP method (`GET`, `POST`, ...).
    pub method: String,
    /// URL path.
    pub path: String,
    /// Raw query string ("" when none).
    pub query: String,
    /// Kubernetes verb: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`; for non-resource URLs the lower-cased method.
    pub verb: String,
    /// Whether this was a resource request (false for discovery, `/version`, `/openapi`).
    pub is_resource_request: bool,
    /// API group ("" for core).
    pub api_group: String,
    /// API version.
    pub api_version: String,
    /// Plural resource name.
    pub resource: String,
    /// Subresource (`status`) or "".
    pub subresource: String,
    /// Namespace or "".
    pub namespace: String,
    /// Object name or "".
    pub name: String,
    /// The `Content-Type` of the request body ("" when none), e.g. the patch type.
    pub content_type: String,
    /// HTTP status code answered.
    pub status: u16,
    /// Whether the answer was an injected fault.
    pub injected_fault: bool,
    /// When the request arrived (before any injected delay).
    pub received: Instant,
    /// When its answer was ready (for a watch: when the stream began).
    pub answered: Instant,
}

/// Something armed for the next `remaining` requests whose path starts with `path_prefix`:
/// a fault (the status to answer writes with) or a delay (how late to answer any request).
#[derive(Debug, Clone)]
struct Armed<T> {
    path_prefix: String,
    remaining: usize,
    what: T,
}

/// Arms `what` for the next `count` requests under `path_prefix`.
fn arm<T>(list: &Mutex<Vec<Armed<T>>>, path_prefix: &str, count: usize, what: T) {
    lock(list).push(Armed {
        path_prefix: path_prefix.to_string(),
        remaining: count,
        what,
    });
}

/// Consumes one use of the first entry armed for `path`.
fn take<T: Copy>(list: &Mutex<Vec<Armed<T>>>, path: &str) -> Option<T> {
    let mut armed = lock(list);
    let entry = armed
        .iter_mut()
        .find(|a| a.remaining > 0 && path.starts_with(&a.path_prefix))?;
    entry.remaining -= 1;
    let what = entry.what;
    armed.retain(|a| a.remaining > 0);
    Some(what)
}

/// A time during which every request under `path_prefix` is answered `delay` late: an
/// overloaded API server is slow for a while, for every client at once, so one client's
/// sequential requests (the pages of a list) do not soak up a slowness meant for all.
#[derive(Debug, Clone)]
struct SlowSpell {
    path_prefix: String,
    until: Instant,
    delay: Duration,
}

/// The hooks' shared state.
#[derive(Debug, Default)]
pub(crate) struct Hooks {
    faults: Mutex<Vec<Armed<u16>>>,
    read_faults: Mutex<Vec<Armed<u16>>>,
    delays: Mutex<Vec<Armed<Duration>>>,
    slow_spells: Mutex<Vec<SlowSpell>>,
    watch_event_delays: Mutex<BTreeMap<String, Duration>>,
    log: Mutex<Vec<RecordedRequest>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Hooks {
    /// Arms a fault: the next `count` writes under `path_prefix` answer `status`.
    pub(crate) fn inject(&self, path_prefix: &str, count: usize, status: u16) {
        arm(&self.faults, path_prefix, count, status);
    }

    /// Consumes one fault matching `path`, returning the status to answer.
    pub(crate) fn take_fault(&self, path: &str) -> Option<u16> {
        take(&self.faults, path)
    }

    /// Arms a fault for reads: the next `count` gets, lists and watches under `path_prefix`
    /// answer `status`.
    pub(crate) fn inject_read(&self, path_prefix: &str, count: usize, status: u16) {
        arm(&self.read_faults, path_prefix, count, status);
    }

    /// Consumes one read fault matching `path`, returning the status to answer.
    pub(crate) fn take_read_fault(&self, path: &str) -> Option<u16> {
        take(&self.read_faults, path)
    }

    /// Arms a delay: the next `count` requests under `path_prefix` are answered `delay` late.
    pub(crate) fn inject_delay(&self, path_prefix: &str, count: usize, delay: Duration) {
        arm(&self.delays, path_prefix, count, delay);
    }

    /// Makes every request under `path_prefix` that arrives in the next `length` answer
    /// `delay` late.
    pub(crate) fn slow_down(&self, path_prefix: &str, length: Duration, delay: Duration) {
        lock(&self.slow_spells).push(SlowSpell {
            path_prefix: path_prefix.to_string(),
            until: Instant::now() + length,
            delay,
        });
    }

    /// How long to wait before answering `path`: one armed delay (consumed), else the
    /// longest slow spell it falls in.
    pub(crate) fn take_delay(&self, path: &str) -> Option<Duration> {
        take(&self.delays, path).or_else(|| {
            let now = Instant::now();
            let mut spells = lock(&self.slow_spells);
            spells.retain(|spell| spell.until > now);
            spells
                .iter()
                .filter(|spell| path.starts_with(&spell.path_prefix))
                .map(|spell| spell.delay)
                .max()
        })
    }

    /// Makes the live events of `resource` reach watches started from now on `delay` late.
    pub(crate) fn delay_watch_events(&self, resource: &str, delay: Duration) {
        lock(&self.watch_event_delays).insert(resource.to_owned(), delay);
    }

    /// How late a new watch of `resource` gets its events.
    pub(crate) fn watch_event_delay(&self, resource: &str) -> Duration {
        lock(&self.watch_event_delays)
            .get(resource)
            .copied()
            .unwrap_or_default()
    }

    /// Records a request.
    pub(crate) fn record(&self, request: RecordedRequest) {
        lock(&self.log).push(request);
    }

    /// A copy of the log.
    pub(crate) fn log(&self) -> Vec<RecordedRequest> {
        lock(&self.log).clone()
    }

    /// How many requests the log holds (without copying it).
    pub(crate) fn log_len(&self) -> usize {
        lock(&self.log).len()
    }

    /// Empties the log.
    pub(crate) fn clear_log(&self) {
        lock(&self.log).clear();
    }
}

/// The verbs used per `(group, resource[/subresource])`: what a least-privilege RBAC Role
/// must grant for the requests logged. Only resource requests that were not injected
/// faults are counted.
pub fn rbac_summary(log: &[RecordedRequest]) -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut out: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for r in log
        .iter()
        .filter(|r| r.is_resource_request && !r.injected_fault)
    {
        let resource = if r.subresource.is_empty() {
            r.resource.clone()
        } else {
            format!("{}/{}", r.resource, r.subresource)
        };
        out.entry((r.api_group.clone(), resource))
            .or_default()
            .insert(r.verb.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_consumed_in_order_and_by_prefix() {
        let hooks = Hooks::default();
        hooks.inject("/apis/x", 2, 409);
        assert_eq!(hooks.take_fault("/api/v1/pods"), None);
        let taken: Vec<_> = (0..3)
            .map(|_| hooks.take_fault("/apis/x/v1/things"))
            .collect();
        assert_eq!(taken, [Some(409), Some(409), None]);
    }

    #[test]
    fn read_faults_are_armed_apart_from_write_faults() {
        let hooks = Hooks::default();
        hooks.inject_read("/apis/x", 1, 403);
        assert_eq!(hooks.take_fault("/apis/x/v1/things"), None);
        assert_eq!(hooks.take_read_fault("/apis/x/v1/things"), Some(403));
        assert_eq!(hooks.take_read_fault("/apis/x/v1/things"), None);
    }

    #[test]
    fn delays_are_consumed_by_prefix_and_count() {
        let hooks = Hooks::default();
        hooks.inject_delay("/apis/x", 2, Duration::from_millis(300));
        assert_eq!(hooks.take_delay("/api/v1/pods"), None);
        for _ in 0..2 {
            assert_eq!(
                hooks.take_delay("/apis/x/v1/things"),
                Some(Duration::from_millis(300))
            );
        }
        assert_eq!(hooks.take_delay("/apis/x/v1/things"), None);
    }

    #[test]
    fn a_slow_spell_delays_every_request_under_its_prefix_until_it_ends() {
        let hooks = Hooks::default();
        let delay = Duration::from_millis(300);
        hooks.slow_down("/apis/x", Duration::from_secs(3_600), delay);
        hooks.slow_down("/apis/y", Duration::ZERO, delay);
        assert_eq!(hooks.take_delay("/api/v1/pods"), None);
        for _ in 0..50 {
            assert_eq!(hooks.take_delay("/apis/x/v1/things"), Some(delay));
        }
        // A spell that has ended delays nothing.
        assert_eq!(hooks.take_delay("/apis/y/v1/things"), None);
    }
}
