//! The coordinator's side of inference (see [`super::infer`]): each pod's setup inferred
//! again when what it is inferred from changes, its inference health (the stale reason naming
//! what is missing), its `ditto_live_inferred` series and one log line per change.

use super::{Coordinator, Entry, infer};

/// The labels of `ditto_live_inferred` (one series per pod).
const INFERRED_LABELS: [&str; 7] = [
    "instance",
    "model",
    "gpu",
    "tp",
    "model_source",
    "gpu_source",
    "tp_source",
];

/// Registers `ditto_live_inferred` in `registry`.
pub(super) fn register_gauge(
    registry: &prometheus::Registry,
) -> Result<prometheus::IntGaugeVec, prometheus::Error> {
    let gauge = prometheus::IntGaugeVec::new(
        prometheus::Opts::new(
            "ditto_live_inferred",
            "What the live mirror inferred each pod to run (1), or 0 while it cannot be \
             inferred (the pod is stale, signal inference); labels carry each value's source",
        ),
        &INFERRED_LABELS,
    )?;
    registry.register(Box::new(gauge.clone()))?;
    Ok(gauge)
}

impl Coordinator {
    /// Infers again what pod `id` runs from its inputs (when its source infers): its
    /// inference health (the stale reason naming what is missing) and its
    /// `ditto_live_inferred` series follow. True when the outcome changed.
    pub(super) fn refresh_inference(&mut self, id: &str) -> bool {
        let Some(entry) = self.pods.get(id) else {
            return false;
        };
        let source = &self.config.sources[entry.pod.source];
        let Some(spec) = &source.infer else {
            return false;
        };
        let options = &self.config.infer;
        let inferred = infer::infer(&entry.inputs, &source.template, spec, options, |model| {
            infer::find_model_config(model, options)
        });
        if entry.inferred.as_ref() == Some(&inferred) {
            return false;
        }
        let setup = &inferred.setup;
        let labels = vec![
            id.to_owned(),
            setup.model.clone(),
            setup.gpu.clone(),
            if setup.tp == 0 {
                String::new()
            } else {
                setup.tp.to_string()
            },
            setup.model_source.clone(),
            setup.gpu_source.clone(),
            setup.tp_source.clone(),
        ];
        let reason = inferred.instance.as_ref().err().cloned();
        match &reason {
            None => tracing::info!(
                pod = %id, model = %setup.model, model_source = %setup.model_source,
                config = %setup.config_source, gpu = %setup.gpu, gpu_source = %setup.gpu_source,
                tp = setup.tp, tp_source = %setup.tp_source, pool = %setup.pool,
                "live mirror: pod inferred"
            ),
            // Before its first page, a pod whose args name no model is only waiting.
            Some(reason) if reason == infer::PENDING_MODEL => {
                tracing::debug!(pod = %id, "live mirror: waiting for the pod's model_name");
            }
            Some(reason) => {
                tracing::warn!(pod = %id, %reason, "live mirror: cannot infer what the pod runs");
            }
        }
        if let Some(entry) = self.pods.get_mut(id) {
            if let Some(old) = entry.inferred_labels.take()
                && old != labels
            {
                let old: Vec<&str> = old.iter().map(String::as_str).collect();
                let _ = self.inferred_gauge.remove_label_values(&old);
            }
            let values: Vec<&str> = labels.iter().map(String::as_str).collect();
            self.inferred_gauge
                .with_label_values(&values)
                .set(i64::from(reason.is_none()));
            entry.inferred_labels = Some(labels);
            entry.inferred = Some(inferred);
            entry.pod.set_health(|health| {
                health.inference = reason.map(|reason| format!("inference: {reason}"));
            });
        }
        true
    }

    /// Drops a retired pod's inference series.
    pub(super) fn forget_inference(&self, id: &str, entry: &Entry) {
        let _ = self.metrics.stale.remove_label_values(&[id, "inference"]);
        if let Some(labels) = &entry.inferred_labels {
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            let _ = self.inferred_gauge.remove_label_values(&labels);
        }
    }
}
