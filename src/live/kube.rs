//! The coordinator's side of Kubernetes discovery: what each source reports becomes the
//! mirrored pod set, at most `--max-instances` served pods (the first by `namespace/name`),
//! lost pods stale then retired, a failing source's pods stale with its reason.

use std::collections::BTreeMap;
use std::time::Instant;

use super::{Coordinator, Discovery, k8s};

impl Coordinator {
    /// Applies what Kubernetes discovery reports (see [`Self::apply_kube`]); an outage marks
    /// every pod of the source stale.
    pub(super) fn on_kube(&mut self, news: k8s::KubeNews) {
        match news {
            k8s::KubeNews::Outage { source, reason } => {
                for entry in self
                    .pods
                    .values()
                    .filter(|entry| entry.pod.source == source)
                {
                    entry
                        .pod
                        .set_health(|health| health.discovery = Some(reason.clone()));
                }
            }
            k8s::KubeNews::Pods {
                source,
                pods,
                degraded,
            } => {
                self.kube_views.insert(source, (pods, degraded));
                if self.apply_kube(source) {
                    self.resync();
                }
            }
        }
    }

    /// Mirrors what source `source` last reported (whether the pod set changed): served pods
    /// are added (or restarted when their IP changed), up to `--max-instances` in all, by
    /// id (`namespace/name`) order; the served pods past it are left out (never scraped,
    /// each marked stale on `/metrics`: see [`super::limit`]). Known pods that are gone or not served turn stale at once and are retired
    /// after `retire_after` (at once when their room is needed by a served pod); a degraded
    /// source's pods carry its failure as their discovery reason.
    fn apply_kube(&mut self, source: usize) -> bool {
        let Some((pods, degraded)) = self.kube_views.remove(&source) else {
            return false;
        };
        let now = Instant::now();
        let mut changed = false;
        let views: BTreeMap<&str, &k8s::PodView> =
            pods.iter().map(|view| (view.id.as_str(), view)).collect();
        let served: Vec<&k8s::PodView> = pods
            .iter()
            .filter(|view| view.address.is_some() && view.problem.is_none())
            .collect();
        let wanted: Vec<&str> = served.iter().map(|view| view.id.as_str()).collect();
        let (admitted, cut) = self.cut_to_room(source, &wanted);
        changed |= cut;
        for view in &served[..admitted] {
            let Some(address) = &view.address else {
                continue;
            };
            match self.pods.get_mut(&view.id) {
                Some(entry) if entry.pod.source != source => {
                    tracing::debug!(pod = %view.id, "live mirror: pod selected by two sources; kept in the first");
                    continue;
                }
                Some(entry) if entry.pod.address == *address => {
                    changed |= entry.role != view.role;
                    entry.role = view.role;
                    let (facts, node_gpu) = (Some(view.facts.clone()), view.node_gpu.clone());
                    if entry.inputs.facts != facts || entry.inputs.node_gpu != node_gpu {
                        entry.inputs.facts = facts;
                        entry.inputs.node_gpu = node_gpu;
                        changed |= self.refresh_inference(&view.id);
                    }
                    continue;
                }
                Some(_) => {
                    // Same name, new IP: a new pod process; start over.
                    self.retire(&view.id);
                }
                None => {}
            }
            self.add(source, view.id.clone(), address.clone());
            if let Some(entry) = self.pods.get_mut(&view.id) {
                entry.role = view.role;
                entry.inputs.facts = Some(view.facts.clone());
                entry.inputs.node_gpu = view.node_gpu.clone();
            }
            self.refresh_inference(&view.id);
            changed = true;
        }
        self.note_discovery(source, &views, degraded.as_ref(), now);
        let left_out: Vec<String> = served[admitted..]
            .iter()
            .map(|view| view.id.clone())
            .collect();
        drop(views);
        self.kube_views.insert(source, (pods, degraded));
        self.note_left_out(source, left_out);
        changed
    }

    /// Each known pod of `source` gets its discovery reason (deleted, not served, or the
    /// source's degradation), and a lost pod the time it was first found lost.
    fn note_discovery(
        &mut self,
        source: usize,
        views: &BTreeMap<&str, &k8s::PodView>,
        degraded: Option<&String>,
        now: Instant,
    ) {
        for (id, entry) in self
            .pods
            .iter_mut()
            .filter(|(_, entry)| entry.pod.source == source)
        {
            let problem = match views.get(id.as_str()) {
                None => Some("pod deleted".to_owned()),
                Some(view) => view.problem.clone(),
            };
            if problem.is_some() {
                entry.vanished_since.get_or_insert(now);
            } else {
                entry.vanished_since = None;
            }
            let reason = problem.or_else(|| degraded.cloned());
            entry.pod.set_health(|health| health.discovery = reason);
        }
    }

    /// Retires the Kubernetes-discovered pods lost for longer than `retire_after`.
    pub(super) fn retire_kube(&mut self) {
        let now = Instant::now();
        let grace = self.config.retire_after;
        let expired: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, entry)| {
                matches!(
                    self.config.sources[entry.pod.source].discovery,
                    Discovery::Kubernetes(_)
                ) && entry
                    .vanished_since
                    .is_some_and(|since| now.duration_since(since) >= grace)
            })
            .map(|(id, _)| id.clone())
            .collect();
        let mut changed = false;
        for id in expired {
            changed |= self.retire(&id);
        }
        if changed && self.any_left_out() {
            // Room was made: pods left out over the limit may fit now.
            let sources: Vec<usize> = self.kube_views.keys().copied().collect();
            for source in sources {
                self.apply_kube(source);
            }
        }
        if changed {
            self.resync();
        }
    }
}
