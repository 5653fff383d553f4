//! The coordinator's `--max-instances` bookkeeping, shared by every kind of source (static,
//! DNS, Kubernetes): which served pods are left out, each marked stale on `/metrics`
//! (`ditto_live_stale{signal="over_limit"}`, never scraped: a left-out pod is not an
//! instance, so GetSnapshot does not list it), their count (`ditto_live_pods_over_limit`),
//! and one log line per change of that count.

use std::collections::BTreeSet;

use super::Coordinator;

/// The `signal` label that marks a served pod left out over `--max-instances`.
pub const OVER_LIMIT_SIGNAL: &str = "over_limit";

impl Coordinator {
    /// Records the served pods of `source` left out over `--max-instances` (in their
    /// order): each marked stale (at most `--max-instances` of them marked one by one, the
    /// rest counted only, so the series stay bounded), their total counted, one log line
    /// when the total changes.
    pub(super) fn note_left_out(&mut self, source: usize, left_out: Vec<String>) {
        let max = self.store.limits().max_instances;
        let before: usize = self.left_out.values().map(Vec::len).sum();
        if left_out.is_empty() {
            self.left_out.remove(&source);
        } else {
            self.left_out.insert(source, left_out);
        }
        let total: usize = self.left_out.values().map(Vec::len).sum();
        self.mark_left_out(max);
        self.metrics
            .pods_over_limit
            .set(i64::try_from(total).unwrap_or(i64::MAX));
        if total == before {
            return;
        }
        if total > 0 {
            let first = self
                .left_out
                .values()
                .find_map(|ids| ids.first())
                .map_or("", String::as_str);
            tracing::warn!(
                left_out = total,
                max_instances = max,
                first_left_out = first,
                "live mirror: more served pods than --max-instances; mirroring the first by \
                 id (namespace/name, or host:port), the rest are left out (not scraped, \
                 marked ditto_live_stale{{signal=\"over_limit\"}})"
            );
        } else {
            tracing::info!("live mirror: every served pod fits in --max-instances again");
        }
    }

    /// Whether any served pod is left out now (room made may let it in).
    pub(super) fn any_left_out(&self) -> bool {
        self.left_out.values().any(|ids| !ids.is_empty())
    }

    /// Sets the over-limit mark on the first `max` left-out pods (not mirrored), and
    /// removes it from the pods no longer left out.
    fn mark_left_out(&mut self, max: usize) {
        let wanted: BTreeSet<String> = self
            .left_out
            .values()
            .flatten()
            .filter(|id| !self.pods.contains_key(id.as_str()))
            .take(max)
            .cloned()
            .collect();
        for id in self.marked_left_out.difference(&wanted) {
            let _ = self
                .metrics
                .stale
                .remove_label_values(&[id.as_str(), OVER_LIMIT_SIGNAL]);
        }
        for id in wanted.difference(&self.marked_left_out) {
            self.metrics
                .stale
                .with_label_values(&[id.as_str(), OVER_LIMIT_SIGNAL])
                .set(1);
        }
        self.marked_left_out = wanted;
    }
}

impl Coordinator {
    /// Adds the static sources' pods (`--pods`, YAML `sources[].pods`): the first
    /// `--max-instances` by id (`host:port`), the rest left out (see
    /// [`Self::note_left_out`]).
    pub(super) fn add_statics(&mut self) {
        let max = self.store.limits().max_instances;
        let mut statics: Vec<(String, usize)> = Vec::new();
        for (index, source) in self.config.sources.iter().enumerate() {
            if let super::Discovery::Static(pods) = &source.discovery {
                statics.extend(pods.iter().map(|pod| (pod.clone(), index)));
            }
        }
        // By id; a pod listed twice is mirrored once, in its first source.
        statics.sort();
        statics.dedup_by(|later, first| later.0 == first.0);
        let mut left_out: std::collections::BTreeMap<usize, Vec<String>> = Default::default();
        for (id, source) in statics {
            if self.pods.len() < max {
                self.add(source, id.clone(), id.clone());
                self.refresh_inference(&id);
            } else {
                left_out.entry(source).or_default().push(id);
            }
        }
        for (source, ids) in left_out {
            self.note_left_out(source, ids);
        }
    }

    /// Mirrors what DNS source `source` resolved (`found`, sorted): up to `--max-instances`
    /// in all, its addresses in order, the rest left out (see [`Self::cut_to_room`]).
    /// Whether the pod set changed.
    pub(super) fn admit_found(&mut self, source: usize, found: &[String]) -> bool {
        let wanted: Vec<&str> = found.iter().map(String::as_str).collect();
        let (admitted, mut changed) = self.cut_to_room(source, &wanted);
        for id in &found[..admitted] {
            if !self.pods.contains_key(id) {
                self.add(source, id.clone(), id.clone());
                changed = true;
            }
        }
        self.note_left_out(source, found[admitted..].to_vec());
        changed
    }

    /// The `--max-instances` cut of one source (static, DNS or Kubernetes) whose pods to
    /// serve are `wanted` (ids, in the source's order): how many of them, from the first,
    /// fit beside the other sources' pods, and whether the pod set changed. Pods of the
    /// source kept only to be retired (not wanted any more) give their room up when the
    /// wanted ones need it; wanted pods past the room that were mirrored are retired, so a
    /// pod that sorts first takes the place of the last one. The caller adds the first
    /// `admitted` and notes the rest left out.
    pub(super) fn cut_to_room(&mut self, source: usize, wanted: &[&str]) -> (usize, bool) {
        let max = self.store.limits().max_instances;
        let others = self
            .pods
            .values()
            .filter(|entry| entry.pod.source != source)
            .count();
        let wanted_ids: BTreeSet<&str> = wanted.iter().copied().collect();
        let unwanted: Vec<String> = self
            .pods
            .iter()
            .filter(|(id, entry)| entry.pod.source == source && !wanted_ids.contains(id.as_str()))
            .map(|(id, _)| id.clone())
            .collect();
        let mut changed = false;
        let mut room = max.saturating_sub(others + unwanted.len());
        if wanted.len() > room && !unwanted.is_empty() {
            for id in &unwanted {
                changed |= self.retire(id);
            }
            room = max.saturating_sub(others);
        }
        let admitted = wanted.len().min(room);
        for id in &wanted[admitted..] {
            if self
                .pods
                .get(*id)
                .is_some_and(|entry| entry.pod.source == source)
            {
                changed |= self.retire(id);
            }
        }
        (admitted, changed)
    }
}
