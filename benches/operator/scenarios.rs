//! The scenarios of one run, in the order they run: each measures its rows into the table on
//! a world the earlier ones leave behind (their locks free, their claims gone or held).

use super::*;

/// One run's world: the API server ([`Server`]), the controller process, the API handles the
/// scenarios drive, the watches that time them, and the table they fill.
pub(super) struct Bench {
    knobs: Knobs,
    server: Server,
    /// Holds the kubeconfig the controller is started with (again, after the restart).
    _dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
    controller: Controller,
    locks: Api<DistributedLock>,
    claims: Api<LockClaim>,
    pods: Api<Pod>,
    jobs: Api<Job>,
    /// When each claim was first seen `Held`.
    seen_held: Seen,
    /// When each claim was first seen with a phase.
    seen_status: Seen,
    table: Table,
}

impl Bench {
    /// The fake API server with the CRDs and the namespace, the controller started and ready,
    /// and the floor measured (every latency is read against it): the API floor and the grant
    /// chain's rows open the table.
    pub(super) async fn start(knobs: Knobs, plane: Plane) -> Self {
        let samples = knobs.samples;
        let server = Server::start(plane).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = server.controller_kubeconfig(dir.path()).await;
        let client: Client = server.bench_client().await;
        let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
            Api::all(client.clone());
        for crd in turnstile_api::crds()
            .into_iter()
            .filter(|_| !server.has_crds())
        {
            create(&crds, &crd).await;
        }
        create_namespace(&client, NAMESPACE).await;
        let locks: Api<DistributedLock> = Api::namespaced(client.clone(), NAMESPACE);
        let claims: Api<LockClaim> = Api::namespaced(client.clone(), NAMESPACE);
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
        let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let jobs: Api<Job> = Api::namespaced(client.clone(), NAMESPACE);

        let controller = Controller::start(&kubeconfig);
        controller.wait_ready().await;

        // The floor: create an object and see it on our own watch.
        // One watch of ConfigMaps for both rows that use them (see `Seen::watch_each`).
        let [seen_maps, seen_marked] = Seen::watch_each(config_maps.clone(), [exists, marked]);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut floor_samples = Vec::new();
        for i in 0..samples {
            let name = format!("floor-{i}");
            let start = Instant::now();
            create(&config_maps, &config_map(&name)).await;
            floor_samples.push(seen_maps.wait(&name).await - start);
        }
        let floor = stats(floor_samples.clone()).p50;
        let mut table = Table {
            floor,
            rows: Vec::new(),
        };
        println!(
            "| scenario | p50 ms (× floor) | p99 ms (× floor) | max ms (× floor) | samples | notes |"
        );
        println!("|---|---|---|---|---|---|");
        table.latency(
            "API floor: create → seen on own watch",
            floor_samples,
            "the unit of the ratios",
        );

        // The least a grant can cost on this API server: the requests of create → `Held` made one
        // after the other by a client in this process, with no controller between them (create,
        // seen on the watch, the finalizer's patch, the status's patch, seen on the watch).
        let mut chain = Vec::new();
        for i in 0..samples {
            let name = format!("chain-{i}");
            let start = Instant::now();
            create(&config_maps, &config_map(&name)).await;
            seen_maps.wait(&name).await;
            for patch in [
                json!({"metadata": {"annotations": {"bench/finalizer": "yes"}}}),
                json!({"data": {MARK: "yes"}}),
            ] {
                config_maps
                    .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .expect("patch");
            }
            chain.push(seen_marked.wait(&name).await - start);
        }
        table.latency(
            "a grant's requests in a row, no controller: create → seen → patch → patch → seen",
            chain,
            "the least create → `Held` can take here",
        );

        let [seen_held, seen_status] = Seen::watch_each(claims.clone(), [held, has_status]);
        Bench {
            knobs,
            server,
            _dir: dir,
            kubeconfig,
            controller,
            locks,
            claims,
            pods,
            jobs,
            seen_held,
            seen_status,
            table,
        }
    }

    /// What the run's API server is.
    pub(super) fn api_server(&self) -> &'static str {
        self.server.describe()
    }

    /// Claim create → `Held` on an idle lock.
    pub(super) async fn idle_lock(&mut self) {
        let claims = (0..self.knobs.samples).map(|i| claim(&format!("idle-{i}"), "idle"));
        let idle = self.held_latencies(&["idle"], claims).await;
        self.row("claim create → `Held`, idle lock", idle);
        // As Turnstile's own clients create claims: the finalizer is there from the start,
        // so the grant is one controller write.
        let samples = self.knobs.samples;
        let claims = (0..samples)
            .map(|i| claim(&format!("idle-fin-{i}"), "idle-fin").with_release_finalizer());
        settle(&self.server, Duration::from_millis(200)).await;
        let (objects_before, events_before) = controller_writes(&self.server);
        let with_finalizer = self.held_latencies(&["idle-fin"], claims).await;
        settle(&self.server, Duration::from_millis(200)).await;
        let (objects_after, events_after) = controller_writes(&self.server);
        // The lock's creation (its finalizer, its first status) is in the count: spread
        // over the samples, it is what a lock costs once.
        let per_claim = |before: usize, after: usize| (after - before) as f64 / samples as f64;
        self.table.latency(
            "claim created with the finalizer → `Held`, idle lock",
            with_finalizer,
            &format!(
                "a whole uncontended life (create → `Held` → delete → gone) costs {:.2} controller object writes and {:.2} Events per claim",
                per_claim(objects_before, objects_after),
                per_claim(events_before, events_after),
            ),
        );
    }

    /// A claim on three idle locks at once: create → `Held` on all of them.
    pub(super) async fn three_locks(&mut self) {
        let triple = ["multi-a", "multi-b", "multi-c"];
        let claims = (0..self.knobs.samples).map(|i| {
            let mut on_three = claim(&format!("multi-{i}"), "");
            on_three.spec = turnstile_api::LockClaimSpec::for_locks(triple);
            on_three
        });
        let multi = self.held_latencies(&triple, claims).await;
        self.row("claim on 3 locks create → `Held`, idle locks", multi);
    }

    /// The names of the claims `keep` selects, by lock, each lock's in queue order (recorded
    /// arrival): claims created several at a time need not arrive in the order of their names.
    async fn queues_by_arrival(
        &self,
        keep: impl Fn(&LockClaim) -> bool,
    ) -> HashMap<String, Vec<String>> {
        let mut claims: Vec<LockClaim> = self
            .claims
            .list(&ListParams::default())
            .await
            .expect("list claims")
            .items
            .into_iter()
            .filter(|claim| keep(claim))
            .collect();
        claims.sort_by_key(LockClaim::arrival);
        let mut queues: HashMap<String, Vec<String>> = HashMap::new();
        for claim in claims {
            queues
                .entry(claim.spec.lock_name.clone())
                .or_default()
                .push(claim.name_any());
        }
        queues
    }

    /// A latency row without a note.
    fn row(&mut self, scenario: &str, samples: Vec<Duration>) {
        self.table.latency(scenario, samples, "");
    }

    /// Creates the mutexes `lock_names`, then each of `claims` (on them) in turn: the time
    /// from its create to `Held`. After each, the claim is deleted and the locks waited free,
    /// so every sample starts alike.
    async fn held_latencies(
        &self,
        lock_names: &[&str],
        claims: impl Iterator<Item = LockClaim>,
    ) -> Vec<Duration> {
        for name in lock_names {
            create(&self.locks, &lock(name, 1)).await;
        }
        let mut samples = Vec::new();
        for claim in claims {
            let name = claim.name_any();
            let start = Instant::now();
            create(&self.claims, &claim).await;
            samples.push(self.seen_held.wait(&name).await - start);
            self.claims
                .delete(&name, &DeleteParams::default())
                .await
                .expect("delete");
            for lock in lock_names {
                wait_free(&self.locks, lock).await;
            }
        }
        samples
    }

    /// Release (claim deleted) → the one waiter `Held`.
    pub(super) async fn release(&mut self) {
        let samples = self.knobs.samples;
        // Release → next Held, one waiter behind the holder.
        create(&self.locks, &lock("relay", 1)).await;
        create(&self.claims, &claim("relay-0000", "relay")).await;
        self.seen_held.wait("relay-0000").await;
        let mut relay = Vec::new();
        for i in 0..samples {
            let next = format!("relay-{:04}", i + 1);
            create(&self.claims, &claim(&next, "relay")).await;
            self.seen_status.wait(&next).await;
            let start = Instant::now();
            self.claims
                .delete(&format!("relay-{i:04}"), &DeleteParams::default())
                .await
                .expect("delete");
            relay.push(self.seen_held.wait(&next).await - start);
        }
        self.row("release (claim deleted) → next `Held`", relay);
    }

    /// Hand-offs at the head of a deep queue, and the API writes each costs; returns those
    /// counts, sorted.
    pub(super) async fn deep_queue(&mut self) -> HandOffWrites {
        let samples = self.knobs.samples;
        let deep = self.knobs.deep;
        // A deep queue.
        create(&self.locks, &lock("deep", 1)).await;
        create_all(
            &self.claims,
            (0..=deep)
                .map(|i| claim(&format!("deep-{i:05}"), "deep"))
                .collect(),
        )
        .await;
        self.seen_status.wait_count("deep-", deep + 1).await;
        settle(&self.server, Duration::from_millis(500)).await;
        // They were created 16 at a time: the queue is in the order they arrived, which the
        // statuses record (`arrivedAt`), not their names.
        let queue = self
            .queues_by_arrival(|claim| claim.name_any().starts_with("deep-"))
            .await
            .remove("deep")
            .expect("the deep queue's claims");
        let mut hand_offs = Vec::new();
        let mut objects = Vec::new();
        let mut events = Vec::new();
        let writes_so_far = || controller_writes(&self.server);
        for i in 0..samples.min(deep) {
            let (objects_before, events_before) = writes_so_far();
            let start = Instant::now();
            self.claims
                .delete(&queue[i], &DeleteParams::default())
                .await
                .expect("delete");
            hand_offs.push(self.seen_held.wait(&queue[i + 1]).await - start);
            settle(&self.server, Duration::from_millis(200)).await;
            let (objects_after, events_after) = writes_so_far();
            objects.push(objects_after - objects_before);
            events.push(events_after - events_before);
        }
        objects.sort();
        events.sort();
        let median = |counts: &[usize]| counts[counts.len() / 2];
        self.table.latency(
            &format!("hand-off, one lock, {deep} waiters"),
            hand_offs,
            &format!(
                "API writes per hand-off: objects median {}, max {}; Events apart median {}",
                median(&objects),
                objects.last().copied().unwrap_or(0),
                median(&events),
            ),
        );
        HandOffWrites { objects, events }
    }

    /// Pod-owned claims, gated Jobs and gated Pods on idle locks.
    pub(super) async fn owned_and_gated(&mut self) {
        let samples = self.knobs.samples;
        // Pod-owned claims and gated Jobs on an idle lock.
        create(&self.locks, &lock("owned", 1)).await;
        let mut owned = Vec::new();
        for i in 0..samples {
            let pod_name = format!("pod-{i}");
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": pod_name},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}
            }))
            .expect("pod");
            let pod = self
                .pods
                .create(&PostParams::default(), &pod)
                .await
                .expect("pod");
            let mut owned_claim = claim(&format!("owned-{i}"), "owned");
            owned_claim.metadata.owner_references = Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    name: pod_name.clone(),
                    uid: pod.uid().unwrap_or_default(),
                    controller: Some(true),
                    block_owner_deletion: None,
                },
            ]);
            let start = Instant::now();
            create(&self.claims, &owned_claim).await;
            owned.push(self.seen_held.wait(&format!("owned-{i}")).await - start);
            self.claims
                .delete(&format!("owned-{i}"), &DeleteParams::default())
                .await
                .expect("delete");
            wait_free(&self.locks, "owned").await;
        }
        self.row("Pod-owned claim create → `Held`", owned);

        let gated_jobs = (0..samples).map(gated_job);
        let gated = self
            .gated_latencies(&self.jobs, unsuspended, "gate", gated_jobs)
            .await;
        self.row("gated Job create → unsuspended", gated);

        // A Pod with the lock label and scheduling gate: create → gate removed.
        let gated_pods = (0..samples).map(gated_pod);
        let ungated_after = self
            .gated_latencies(&self.pods, ungated, "pod-gate", gated_pods)
            .await;
        self.row("gated Pod create → gate removed", ungated_after);
    }

    /// Creates lock `lock_name` (a mutex), then each of `workloads` (gated on it) in turn: the
    /// time from its create to a watch of `api` seeing it `let_go`. After each, its claim
    /// (`<name>-<lock_name>`) is deleted and the lock waited free, so every sample starts
    /// alike.
    async fn gated_latencies<K>(
        &self,
        api: &Api<K>,
        let_go: fn(&K) -> bool,
        lock_name: &str,
        workloads: impl Iterator<Item = K>,
    ) -> Vec<Duration>
    where
        K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
        K: Send + Sync + 'static,
    {
        let seen = Seen::watch(api.clone(), let_go);
        create(&self.locks, &lock(lock_name, 1)).await;
        let mut samples = Vec::new();
        for workload in workloads {
            let name = workload.meta().name.clone().expect("a name");
            let start = Instant::now();
            create(api, &workload).await;
            samples.push(seen.wait(&name).await - start);
            self.claims
                .delete(&format!("{name}-{lock_name}"), &DeleteParams::default())
                .await
                .ok();
            wait_free(&self.locks, lock_name).await;
        }
        samples
    }

    /// Many locks with 10 claims each, then the wave (every holder released at once); the
    /// controller's requests per grant over both, and its memory with all those claims cached.
    pub(super) async fn scale_and_wave(&mut self) {
        let samples = self.knobs.samples;
        let deep = self.knobs.deep;
        let locks_at_scale = self.knobs.locks;
        // Scale: many locks, 10 claims each.
        let requests_before = self.server.controller_requests().len();
        let start = Instant::now();
        create_all(
            &self.locks,
            (0..locks_at_scale)
                .map(|l| lock(&format!("s{l:05}"), 1))
                .collect(),
        )
        .await;
        let mut scale_claims = Vec::new();
        for c in 0..10 {
            for l in 0..locks_at_scale {
                scale_claims.push(claim(&format!("s{l:05}-{c}"), &format!("s{l:05}")));
            }
        }
        create_all(&self.claims, scale_claims).await;
        let created = start.elapsed();
        let every_holder = self.seen_held.wait_count("s", locks_at_scale).await - start;
        let every_status = self.seen_status.wait_count("s", locks_at_scale * 10).await - start;
        self.table.fact(
            &format!("{locks_at_scale} locks × 10 claims: created / every lock held / every claim has a status"),
            format!(
                "{:.1} s / {:.1} s / {:.1} s",
                created.as_secs_f64(),
                every_holder.as_secs_f64(),
                every_status.as_secs_f64()
            ),
        );
        settle(&self.server, Duration::from_millis(1000)).await;

        // The wave: every holder releases at once. The claims were created 16 at a time, so
        // each lock's holder and next are the first two by arrival (`arrivedAt`), which need
        // not be `-0` and `-1`.
        let queues = self
            .queues_by_arrival(|claim| {
                let lock = &claim.spec.lock_name;
                lock.starts_with('s') && claim.name_any().starts_with(&format!("{lock}-"))
            })
            .await;
        let mut heads: Vec<(String, String)> = queues
            .into_values()
            .filter_map(|queue| Some((queue.first()?.clone(), queue.get(1)?.clone())))
            .collect();
        heads.sort();
        let wave_cpu = CpuSample::take(self.controller.child.id());
        let wave_start = Instant::now();
        let deletes: Vec<String> = heads.iter().map(|(holder, _)| holder.clone()).collect();
        let deleted_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        futures::stream::iter(deletes)
            .map(|name| {
                let claims = self.claims.clone();
                let deleted_at = deleted_at.clone();
                async move {
                    claims.delete(&name, &DeleteParams::default()).await.ok();
                    deleted_at
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(name, Instant::now());
                }
            })
            .buffer_unordered(16)
            .collect::<Vec<_>>()
            .await;
        let mut wave = Vec::new();
        for (holder, next) in &heads {
            let next = self.seen_held.wait(next).await;
            let deleted = deleted_at
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(holder)
                .copied()
                .unwrap_or(wave_start);
            wave.push(next.saturating_duration_since(deleted));
        }
        let wave_all = wave_start.elapsed();
        let wave_cpu = CpuSample::take(self.controller.child.id()).shares_since(&wave_cpu);
        self.table.latency(
            &format!("hand-off wave: {locks_at_scale} holders released at once → each next `Held`"),
            wave,
            &format!(
                "all done {:.2} s after the first delete; {wave_cpu}",
                wave_all.as_secs_f64()
            ),
        );
        settle(&self.server, Duration::from_millis(1000)).await;
        let scale_requests: Vec<RecordedRequest> = self
            .server
            .controller_requests()
            .into_iter()
            .skip(requests_before)
            .collect();
        let mut by_verb: HashMap<String, usize> = HashMap::new();
        for request in &scale_requests {
            *by_verb.entry(request.verb.clone()).or_default() += 1;
        }
        let grants = (2 * locks_at_scale) as f64;
        let mut verbs: Vec<_> = by_verb.into_iter().collect();
        verbs.sort();
        // The wave's write floor: two plain writes per lock, one after the other, as many
        // locks at once as the wave deleted; on ConfigMaps, and on the wave's own kind (a
        // LockClaim created, then its status patched) in a namespace the controller does not
        // serve: a custom resource's write costs the API server more (schema, CEL rules).
        let client = self.claims.clone().into_client();
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
        let config_map_floor = two_writes_per_lock(locks_at_scale, |l| {
            let config_maps = config_maps.clone();
            async move {
                let name = format!("wave-floor-{l:05}");
                create(&config_maps, &config_map(&name)).await;
                config_maps
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"data": {MARK: "yes"}})),
                    )
                    .await
                    .expect("patch");
            }
        })
        .await;
        create_namespace(&client, WRITES_NAMESPACE).await;
        let unserved: Api<LockClaim> = Api::namespaced(client, WRITES_NAMESPACE);
        let claim_floor = two_writes_per_lock(locks_at_scale, |l| {
            let unserved = unserved.clone();
            async move {
                let name = format!("wave-floor-{l:05}");
                create(&unserved, &claim(&name, "unserved")).await;
                unserved
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {"phase": "Pending"}})),
                    )
                    .await
                    .expect("patch status");
            }
        })
        .await;
        let times = |floor: Duration| wave_all.as_secs_f64() / floor.as_secs_f64().max(1e-9);
        self.table.fact(
            &format!("the wave's write floor: 2 plain writes per lock × {locks_at_scale}, 16 locks at a time"),
            format!(
                "ConfigMaps {:.2} s, LockClaims {:.2} s; the wave took {:.1}× / {:.1}× it",
                config_map_floor.as_secs_f64(),
                claim_floor.as_secs_f64(),
                times(config_map_floor),
                times(claim_floor),
            ),
        );
        self.table.fact(
            "scale: controller API requests per grant, by verb",
            verbs
                .iter()
                .map(|(verb, n)| format!("{verb} {:.2}", *n as f64 / grants))
                .collect::<Vec<_>>()
                .join(", "),
        );
        let (rss, peak) = self.controller.rss_kb();
        self.table.fact(
            &format!(
                "controller RSS with {} claims cached",
                locks_at_scale * 10 + deep + 2 * samples
            ),
            format!(
                "{:.0} MB (peak {:.0} MB)",
                rss as f64 / 1024.0,
                peak as f64 / 1024.0
            ),
        );
    }

    /// The idle row, then a restart, then the namespace torn down; ends the run. Returns the controller's writes while idle
    /// and during the re-sync (leases aside), and the table's rows.
    pub(super) async fn idle_and_restart(self) -> (usize, usize, Vec<String>) {
        let Bench {
            knobs,
            server,
            kubeconfig,
            controller,
            mut table,
            locks,
            claims,
            ..
        } = self;
        let idle_seconds = knobs.idle_seconds;
        // The wave's queues show fresh positions a little after their last grant
        // (`POSITION_REFRESH_DELAY`): idle begins once those writes are done.
        let refresh = u64::try_from(POSITION_REFRESH_DELAY).unwrap_or(0);
        settle(&server, Duration::from_secs(refresh + 1)).await;
        // Idle, then a restart.
        let before = server
            .controller_requests()
            .iter()
            .filter(|r| is_write(r))
            .count();
        tokio::time::sleep(Duration::from_secs(idle_seconds)).await;
        let idle_writes = server
            .controller_requests()
            .iter()
            .filter(|r| is_write(r))
            .count()
            - before;
        table.fact(
            &format!("idle: controller writes in {idle_seconds} s"),
            idle_writes.to_string(),
        );

        controller.stop();
        let before = server
            .controller_requests()
            .iter()
            .filter(|r| is_write(r))
            .count();
        let start = Instant::now();
        let controller = Controller::start(&kubeconfig);
        let ready = controller.wait_ready().await - start;
        settle(&server, Duration::from_secs(3)).await;
        let resync_writes = server
            .controller_requests()
            .iter()
            .filter(|r| is_write(r))
            .filter(|r| r.resource != "leases")
            .count()
            - before;
        table.fact(
            "restart: until ready / writes during the re-sync",
            format!("{:.2} s / {resync_writes}", ready.as_secs_f64()),
        );
        teardown(&server, &locks, &claims, &mut table).await;
        controller.stop();
        (idle_writes, resync_writes, table.rows)
    }
}

/// Creates the namespace `name`.
async fn create_namespace(client: &Client, name: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    create(
        &namespaces,
        &serde_json::from_value(json!({"metadata": {"name": name}})).expect("ns"),
    )
    .await;
}

/// How long `locks` runs of `writes` (each a lock's two writes) take, 16 at a time.
async fn two_writes_per_lock<F, Fut>(locks: usize, writes: F) -> Duration
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let start = Instant::now();
    futures::stream::iter(0..locks)
        .map(writes)
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    start.elapsed()
}

/// The controller's writes so far: (to objects, Events).
fn controller_writes(server: &Server) -> (usize, usize) {
    let writes: Vec<_> = server
        .controller_requests()
        .into_iter()
        .filter(is_write)
        .collect();
    let events = writes.iter().filter(|r| r.resource == "events").count();
    (writes.len() - events, events)
}

/// The run's namespace deleted with everything left in it (the controller running), against
/// a namespace of as many ConfigMaps (no controller, no finalizers) deleted just before.
async fn teardown(
    server: &Server,
    locks: &Api<DistributedLock>,
    claims: &Api<LockClaim>,
    table: &mut Table,
) {
    let client = locks.clone().into_client();
    let lock_count = locks
        .list_metadata(&ListParams::default())
        .await
        .expect("list locks")
        .items
        .len();
    let claim_count = claims
        .list_metadata(&ListParams::default())
        .await
        .expect("list claims")
        .items
        .len();
    let objects = lock_count + claim_count;

    create_namespace(&client, FLOOR_NAMESPACE).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let config_maps: Api<ConfigMap> = Api::namespaced(client, FLOOR_NAMESPACE);
    create_all(
        &config_maps,
        (0..objects)
            .map(|i| config_map(&format!("teardown-floor-{i:05}")))
            .collect(),
    )
    .await;
    let floor = delete_namespace(&namespaces, FLOOR_NAMESPACE).await;

    let before = server.controller_requests().len();
    let torn_down = delete_namespace(&namespaces, NAMESPACE).await;
    let writes: Vec<RecordedRequest> = server
        .controller_requests()
        .into_iter()
        .skip(before)
        .filter(is_write)
        .collect();
    let landed = writes.iter().filter(|w| w.status < 300).count();
    let statuses = writes.iter().filter(|w| w.subresource == "status").count();
    let events = writes.iter().filter(|w| w.resource == "events").count();
    table.fact(
        &format!("namespace teardown: {lock_count} locks + {claim_count} claims, the controller running"),
        format!(
            "{:.1} s ({:.1}× {objects} ConfigMaps' {:.1} s); controller writes per object {:.2} ({} more refused, 409 or 404, and retried or moot; statuses {statuses}, Events {events})",
            torn_down.as_secs_f64(),
            torn_down.as_secs_f64() / floor.as_secs_f64().max(1e-9),
            floor.as_secs_f64(),
            landed as f64 / objects.max(1) as f64,
            writes.len() - landed,
        ),
    );
}

/// Deletes the namespace `name` and waits until it is gone; the time that took.
async fn delete_namespace(namespaces: &Api<Namespace>, name: &str) -> Duration {
    let start = Instant::now();
    namespaces
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete namespace");
    let deadline = Instant::now() + WAIT;
    while namespaces
        .get_opt(name)
        .await
        .expect("get namespace")
        .is_some()
    {
        assert!(
            Instant::now() < deadline,
            "namespace {name} never went away"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}
