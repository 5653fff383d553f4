//! Desired replicas for autoscalers: the capacity question the forecast loop asks of each
//! variant on the mirrored state and observed traffic, and the gauges its answer yields
//! (`ditto_desired_replicas` and friends, shaped like llm-d's `wva_desired_replicas`); the
//! KEDA scaler (`server::keda`) asks the same question under the load forecast's stages
//! (`question_for`).
//!
//! Pure: the server's loop supplies the snapshot, the clock and the settings. A variant is
//! the set of mirrored instances sharing a base name (the instance id without its
//! `namespace/` prefix, `:port` suffix and trailing `-<ordinal>`), e.g. `vllm-0`..`vllm-3`
//! or `llm-d/vllm-2:8000` are variant `vllm`. Each variant's forecast reads its own pool's
//! observed arrival rate and length mix (the store keeps them per pool); a P/D pair's reads
//! the pair's (every request visits both roles).

use super::MirrorSnapshot;
use super::question::{
    ForecastAnswer, ForecastQuestion, ForecastStart, SloTargets, VariantCandidates,
};
use super::snapshot::{PoolTraffic, TwinSettings};
use crate::cluster::config::InstanceRole;
use crate::workload::{LengthDist, Stage};

/// What the forecast loop asks, apart from the traffic it observes.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredSettings {
    /// Simulated horizon of each forecast, seconds.
    pub horizon_s: f64,
    /// Replications per candidate count.
    pub replications: u32,
    /// The objectives.
    pub slo: SloTargets,
    /// Fraction of requests that must meet every objective.
    pub target_attainment: f64,
    /// Namespace label for instances whose id carries none.
    pub namespace: String,
    /// Seed of every forecast (answers are reproducible from the snapshot).
    pub seed: u64,
}

/// One variant of the mirrored cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Variant {
    /// Base name shared by its instances.
    pub name: String,
    /// Namespace (from the ids, else the settings').
    pub namespace: String,
    /// Served model.
    pub model: String,
    /// Id of the first instance, the template of the forecast.
    pub template_id: String,
    /// Instances mirrored now.
    pub current: u32,
    /// The template's role (`both`, `prefill` or `decode`; llm-d's `llm-d.ai/role`): a
    /// variant is also split by role.
    pub role: InstanceRole,
}

/// What the loop exports for one variant.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    /// The variant.
    pub variant: Variant,
    /// Fewest replicas meeting the target (the most evaluated when none does).
    pub desired: u32,
    /// SLO attainment the forecast gives at `desired` replicas.
    pub attainment: f64,
}

/// Splits an instance id into (namespace, variant base name).
pub fn variant_of(id: &str) -> (Option<&str>, &str) {
    let (namespace, rest) = match id.split_once('/') {
        Some((namespace, rest)) => (Some(namespace), rest),
        None => (None, id),
    };
    let rest = rest.split_once(':').map_or(rest, |(name, _)| name);
    let base = match rest.rsplit_once('-') {
        Some((base, ordinal))
            if !base.is_empty()
                && !ordinal.is_empty()
                && ordinal.bytes().all(|b| b.is_ascii_digit()) =>
        {
            base
        }
        _ => rest,
    };
    (namespace, base)
}

/// The (namespace, pool name) of instance `id`: the namespace its id carries, and the pool
/// `settings.variants` records for it (the live mirror's pods), else its id's base name.
pub fn pool_name<'a>(id: &'a str, settings: &'a TwinSettings) -> (Option<&'a str>, &'a str) {
    let (namespace, name) = variant_of(id);
    let name = settings.variants.get(id).map_or(name, String::as_str);
    (namespace, name)
}

/// The variants of the snapshot's config, in order of first appearance.
pub fn variants(snapshot: &MirrorSnapshot, default_namespace: &str) -> Vec<Variant> {
    let mut out: Vec<Variant> = Vec::new();
    for instance in &snapshot.config.instances {
        let (namespace, name) = pool_name(&instance.id, &snapshot.settings);
        let namespace = namespace.unwrap_or(default_namespace);
        match out
            .iter_mut()
            .find(|v| v.name == name && v.namespace == namespace && v.role == instance.role)
        {
            Some(variant) => variant.current += 1,
            None => out.push(Variant {
                name: name.to_owned(),
                namespace: namespace.to_owned(),
                model: instance.model.clone(),
                template_id: instance.id.clone(),
                current: 1,
                role: instance.role,
            }),
        }
    }
    out
}

/// The P/D pairs among `variants`: each prefill variant with the first decode variant of
/// the same model and namespace, as (prefill index, decode index); a forecast searches the
/// pair's split together ([`split_question`]).
pub fn pd_pairs(variants: &[Variant]) -> Vec<(usize, usize)> {
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    for (p, prefill) in variants.iter().enumerate() {
        if prefill.role != InstanceRole::Prefill {
            continue;
        }
        let decode = variants.iter().position(|v| {
            v.role == InstanceRole::Decode
                && v.model == prefill.model
                && v.namespace == prefill.namespace
                && !pairs
                    .iter()
                    .any(|&(_, d)| variants[d].template_id == v.template_id)
        });
        if let Some(d) = decode {
            pairs.push((p, d));
        }
    }
    pairs
}

/// The capacity question for a P/D pair at the pair's observed arrival rate over the
/// settings' horizon: both counts searched, the split named by the answer's
/// `desired_replicas`. None when the pair has observed no arrivals.
pub fn split_question(
    snapshot: &MirrorSnapshot,
    prefill: &Variant,
    decode: &Variant,
    settings: &DesiredSettings,
    now_us: u64,
) -> Option<ForecastQuestion> {
    let rate = pair_rate(snapshot, prefill, decode, &settings.namespace);
    let stages = vec![Stage {
        rate,
        duration_s: settings.horizon_s,
    }];
    split_question_for(snapshot, prefill, decode, settings, stages, now_us)
}

/// The capacity question for a P/D pair under `stages`: both counts searched from idle
/// instances, with the pair's observed length mix (the decode pool's finished requests,
/// which carry the whole request, else the prefill pool's). None when no stage has
/// arrivals.
pub fn split_question_for(
    snapshot: &MirrorSnapshot,
    prefill: &Variant,
    decode: &Variant,
    settings: &DesiredSettings,
    stages: Vec<Stage>,
    now_us: u64,
) -> Option<ForecastQuestion> {
    let recent = observed_lengths(snapshot, &[decode, prefill], &settings.namespace);
    let mut asked = question_with(snapshot, prefill, settings, stages, recent, now_us)?;
    asked.variants.push(VariantCandidates {
        template_instance_id: decode.template_id.clone(),
        replica_counts: Vec::new(),
    });
    Some(asked)
}

/// The gauges of a P/D pair from its split forecast (None: no traffic, one of each): the
/// desired split's candidate, else the last evaluated (the largest split tried).
pub fn desired_split(
    prefill: &Variant,
    decode: &Variant,
    answer: Option<&ForecastAnswer>,
) -> [Desired; 2] {
    let one = |variant: &Variant, desired: u32, attainment: f64| Desired {
        variant: variant.clone(),
        desired,
        attainment,
    };
    let Some(answer) = answer else {
        return [one(prefill, 1, 1.0), one(decode, 1, 1.0)];
    };
    let chosen = if answer.desired_replicas.is_empty() {
        answer.candidates.last()
    } else {
        answer
            .candidates
            .iter()
            .find(|c| c.replicas == answer.desired_replicas)
    };
    let Some(candidate) = chosen else {
        return [
            one(prefill, prefill.current.max(1), 0.0),
            one(decode, decode.current.max(1), 0.0),
        ];
    };
    let count_of = |variant: &Variant| {
        candidate
            .replicas
            .iter()
            .find(|(id, _)| *id == variant.template_id)
            .map_or(1, |&(_, count)| count.max(1))
    };
    [
        one(prefill, count_of(prefill), candidate.slo_attainment),
        one(decode, count_of(decode), candidate.slo_attainment),
    ]
}

/// Prompt and output lengths to forecast with: the `recent` finished requests' when there
/// are some, else the settings' output distribution and gaussian prompts.
fn lengths(snapshot: &MirrorSnapshot, recent: &[(u32, u32)]) -> (LengthDist, LengthDist) {
    if recent.is_empty() {
        return (
            LengthDist::gaussian(512.0, 256.0, 2, 7000),
            snapshot.settings.output_tokens.clone(),
        );
    }
    let prompts = recent.iter().map(|&(prompt, _)| prompt.max(1)).collect();
    let outputs = recent.iter().map(|&(_, output)| output.max(1)).collect();
    (
        LengthDist::empirical(prompts, None),
        LengthDist::empirical(outputs, None),
    )
}

/// The traffic records of `variant`'s pool (its name, role and namespace; ids without a
/// namespace count in `namespace`).
fn pool_traffic<'a>(
    snapshot: &'a MirrorSnapshot,
    variant: &'a Variant,
    namespace: &'a str,
) -> impl Iterator<Item = &'a PoolTraffic> + 'a {
    snapshot.traffic.pools.iter().filter(move |pool| {
        pool.name == variant.name
            && pool.role == variant.role
            && (pool.namespace == variant.namespace
                || pool.namespace.is_empty() && variant.namespace == namespace)
    })
}

/// The arrival rate `variant`'s own pool was observed at (requests per second).
pub fn observed_rate(snapshot: &MirrorSnapshot, variant: &Variant, namespace: &str) -> f64 {
    let rate: f64 = pool_traffic(snapshot, variant, namespace)
        .map(|pool| pool.arrivals_per_s)
        .sum();
    if rate.is_finite() { rate.max(0.0) } else { 0.0 }
}

/// The arrival rate of a P/D pair: every request visits its decode pods (and its prefill
/// pods unless the decider skips prefill), so the higher of its two pools' rates.
pub fn pair_rate(
    snapshot: &MirrorSnapshot,
    prefill: &Variant,
    decode: &Variant,
    namespace: &str,
) -> f64 {
    observed_rate(snapshot, prefill, namespace).max(observed_rate(snapshot, decode, namespace))
}

/// The recently finished requests' (prompt, output) lengths of the first of `variants`
/// whose pool has some (empty when none has).
pub fn observed_lengths<'a>(
    snapshot: &'a MirrorSnapshot,
    variants: &[&'a Variant],
    namespace: &'a str,
) -> &'a [(u32, u32)] {
    variants
        .iter()
        .flat_map(|variant| pool_traffic(snapshot, variant, namespace))
        .map(|pool| pool.recent_lengths.as_slice())
        .find(|lengths| !lengths.is_empty())
        .unwrap_or_default()
}

/// Requests the mirror holds in flight (waiting or running) on `variant`'s instances.
pub fn in_flight(snapshot: &MirrorSnapshot, variant: &Variant, namespace: &str) -> u64 {
    snapshot
        .config
        .instances
        .iter()
        .zip(&snapshot.instances)
        .filter(|(instance, _)| {
            let (ns, name) = pool_name(&instance.id, &snapshot.settings);
            name == variant.name && ns.unwrap_or(namespace) == variant.namespace
        })
        .map(|(_, state)| {
            let listed = (state.waiting.len() + state.running.len()) as u64;
            let gauged = state
                .gauges
                .as_ref()
                .map_or(0, |g| u64::from(g.running) + u64::from(g.waiting));
            listed.max(gauged)
        })
        .sum()
}

/// The capacity question for `variant` under a piecewise arrival rate `stages`: a search
/// over its replica count from idle instances, with its pool's observed length mix. None
/// when no stage has arrivals (then 1 replica suffices).
pub fn question_for(
    snapshot: &MirrorSnapshot,
    variant: &Variant,
    settings: &DesiredSettings,
    stages: Vec<Stage>,
    now_us: u64,
) -> Option<ForecastQuestion> {
    let recent = observed_lengths(snapshot, &[variant], &settings.namespace);
    question_with(snapshot, variant, settings, stages, recent, now_us)
}

/// [`question_for`] with the length mix of `recent` finished requests.
fn question_with(
    snapshot: &MirrorSnapshot,
    variant: &Variant,
    settings: &DesiredSettings,
    stages: Vec<Stage>,
    recent: &[(u32, u32)],
    now_us: u64,
) -> Option<ForecastQuestion> {
    if !stages
        .iter()
        .any(|stage| stage.rate.is_finite() && stage.rate > 0.0 && stage.duration_s > 0.0)
    {
        return None;
    }
    let (input_tokens, output_tokens) = lengths(snapshot, recent);
    Some(ForecastQuestion {
        start: ForecastStart::Empty,
        stages,
        input_tokens,
        output_tokens,
        variants: vec![VariantCandidates {
            template_instance_id: variant.template_id.clone(),
            replica_counts: Vec::new(),
        }],
        max_cost_per_hour: 0.0,
        slo: settings.slo,
        target_attainment: settings.target_attainment,
        replications: settings.replications,
        quantiles: Vec::new(),
        seed: settings.seed,
        now_us,
    })
}

/// The capacity question for `variant` at its pool's observed arrival rate over the
/// settings' horizon, or None when the pool has observed no arrivals.
pub fn question(
    snapshot: &MirrorSnapshot,
    variant: &Variant,
    settings: &DesiredSettings,
    now_us: u64,
) -> Option<ForecastQuestion> {
    let rate = observed_rate(snapshot, variant, &settings.namespace);
    question_for(
        snapshot,
        variant,
        settings,
        vec![Stage {
            rate,
            duration_s: settings.horizon_s,
        }],
        now_us,
    )
}

/// The gauges of `variant` from the forecast's answer (None: no traffic, 1 replica).
pub fn desired(variant: &Variant, answer: Option<&ForecastAnswer>) -> Desired {
    let Some(answer) = answer else {
        return Desired {
            variant: variant.clone(),
            desired: 1,
            attainment: 1.0,
        };
    };
    let count_of = |replicas: &[(String, u32)]| {
        replicas
            .iter()
            .find(|(id, _)| *id == variant.template_id)
            .map_or(0, |&(_, count)| count)
    };
    let chosen = match answer.desired_replicas.as_slice() {
        [] => answer
            .candidates
            .iter()
            .max_by_key(|candidate| count_of(&candidate.replicas)),
        wanted => {
            let count = count_of(wanted);
            answer
                .candidates
                .iter()
                .find(|candidate| count_of(&candidate.replicas) == count)
        }
    };
    match chosen {
        Some(candidate) => Desired {
            variant: variant.clone(),
            desired: count_of(&candidate.replicas).max(1),
            attainment: candidate.slo_attainment,
        },
        None => Desired {
            variant: variant.clone(),
            desired: variant.current.max(1),
            attainment: 0.0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_names_drop_namespace_port_and_ordinal() {
        assert_eq!(variant_of("vllm-0"), (None, "vllm"));
        assert_eq!(variant_of("llm-d/vllm-12:8000"), (Some("llm-d"), "vllm"));
        assert_eq!(variant_of("ns/decode-a:8000"), (Some("ns"), "decode-a"));
        assert_eq!(variant_of("solo"), (None, "solo"));
        assert_eq!(variant_of("-3"), (None, "-3"));
    }

    fn candidate(count: u32, attainment: f64) -> crate::twin::question::ForecastCandidate {
        crate::twin::question::ForecastCandidate::with_attainment(
            vec![("vllm-0".to_owned(), count)],
            attainment,
        )
    }

    fn variant() -> Variant {
        Variant {
            name: "vllm".to_owned(),
            namespace: "ns".to_owned(),
            model: "m".to_owned(),
            template_id: "vllm-0".to_owned(),
            current: 4,
            role: InstanceRole::Both,
        }
    }

    #[test]
    fn desired_is_the_answer_s_count_or_the_most_evaluated_when_none_meets_the_target() {
        let mut answer = ForecastAnswer {
            candidates: vec![candidate(1, 0.2), candidate(2, 0.7), candidate(3, 0.97)],
            desired_replicas: vec![("vllm-0".to_owned(), 3)],
            generation: 1,
            seed: 0,
            state_age_us: 0,
        };
        let met = desired(&variant(), Some(&answer));
        assert_eq!((met.desired, met.attainment), (3, 0.97));
        answer.candidates.pop();
        answer.desired_replicas.clear();
        let unmet = desired(&variant(), Some(&answer));
        assert_eq!((unmet.desired, unmet.attainment), (2, 0.7));
        let idle = desired(&variant(), None);
        assert_eq!((idle.desired, idle.attainment), (1, 1.0));
    }

    #[test]
    fn a_prefill_variant_pairs_with_a_decode_variant_of_its_model_and_gets_the_split() {
        let role = |name: &str, template: &str, role| Variant {
            name: name.to_owned(),
            template_id: template.to_owned(),
            role,
            ..variant()
        };
        let all = vec![
            role("vllm", "vllm-0", InstanceRole::Both),
            role("decode", "decode-0", InstanceRole::Decode),
            role("prefill", "prefill-0", InstanceRole::Prefill),
        ];
        assert_eq!(pd_pairs(&all), vec![(2, 1)]);
        let mut other_model = all.clone();
        other_model[1].model = "other".to_owned();
        assert!(pd_pairs(&other_model).is_empty());
        let mut split = candidate(0, 0.96);
        split.replicas = vec![("prefill-0".to_owned(), 5), ("decode-0".to_owned(), 2)];
        let mut short = candidate(0, 0.5);
        short.replicas = vec![("prefill-0".to_owned(), 4), ("decode-0".to_owned(), 2)];
        let answer = ForecastAnswer {
            candidates: vec![short, split.clone()],
            desired_replicas: split.replicas.clone(),
            generation: 1,
            seed: 0,
            state_age_us: 0,
        };
        let [prefill, decode] = desired_split(&all[2], &all[1], Some(&answer));
        assert_eq!((prefill.desired, decode.desired), (5, 2));
        assert_eq!((prefill.attainment, decode.attainment), (0.96, 0.96));
        assert_eq!(prefill.variant.role, InstanceRole::Prefill);
        let [idle_p, idle_d] = desired_split(&all[2], &all[1], None);
        assert_eq!((idle_p.desired, idle_d.desired), (1, 1));
    }

    #[test]
    fn each_variant_reads_its_own_pool_and_a_pair_the_busier_of_its_two() {
        let store = crate::twin::store::MirrorStore::new(crate::twin::store::StoreLimits::DEFAULT);
        store
            .sync_config(
                crate::cluster::spec::default_cluster(),
                TwinSettings::defaults(),
                Vec::new(),
            )
            .expect("the default cluster syncs");
        let mut snapshot = (*store.latest().expect("synced").snapshot).clone();
        let pool = |name: &str, role, rate, lengths: Vec<(u32, u32)>| PoolTraffic {
            namespace: String::new(),
            name: name.to_owned(),
            role,
            arrivals_per_s: rate,
            recent_lengths: lengths,
        };
        snapshot.traffic = std::sync::Arc::new(crate::twin::snapshot::TrafficStats {
            arrivals_per_s: 47.0,
            recent_lengths: vec![(1, 1)],
            pools: vec![
                pool("vllm", InstanceRole::Both, 5.0, vec![(700, 70)]),
                pool("pd", InstanceRole::Prefill, 40.0, vec![(100, 1)]),
                pool("pd", InstanceRole::Decode, 30.0, vec![(100, 400)]),
                pool("pd", InstanceRole::Both, 2.0, Vec::new()),
            ],
        });
        let named = |name: &str, role| Variant {
            name: name.to_owned(),
            role,
            ..variant()
        };
        let monolithic = named("vllm", InstanceRole::Both);
        let (prefill, decode) = (
            named("pd", InstanceRole::Prefill),
            named("pd", InstanceRole::Decode),
        );
        // Its own pool only (ids without a namespace count in the default one), never the
        // mirror's 47 shared out.
        assert_eq!(observed_rate(&snapshot, &monolithic, "ns"), 5.0);
        assert_eq!(observed_rate(&snapshot, &monolithic, "other"), 0.0);
        assert_eq!(pair_rate(&snapshot, &prefill, &decode, "ns"), 40.0);
        assert_eq!(
            observed_lengths(&snapshot, &[&decode, &prefill], "ns"),
            [(100, 400)]
        );
        let quiet = named("pd", InstanceRole::Both);
        assert_eq!(
            observed_lengths(&snapshot, &[&quiet, &prefill], "ns"),
            [(100, 1)],
            "the first pool with lengths"
        );
        assert!(observed_lengths(&snapshot, &[&quiet], "ns").is_empty());
        // The capacity questions carry those rates and lengths.
        let settings = DesiredSettings {
            horizon_s: 10.0,
            replications: 1,
            slo: SloTargets::default(),
            target_attainment: 0.9,
            namespace: "ns".to_owned(),
            seed: 0,
        };
        let asked = question(&snapshot, &monolithic, &settings, 1).expect("arrivals");
        assert_eq!(asked.stages[0].rate, 5.0);
        assert_eq!(asked.input_tokens, LengthDist::empirical(vec![700], None));
        let split = split_question(&snapshot, &prefill, &decode, &settings, 1).expect("arrivals");
        assert_eq!(split.stages[0].rate, 40.0);
        assert_eq!(split.output_tokens, LengthDist::empirical(vec![400], None));
        let elsewhere = named("elsewhere", InstanceRole::Both);
        assert!(question(&snapshot, &elsewhere, &settings, 1).is_none());
    }
}
