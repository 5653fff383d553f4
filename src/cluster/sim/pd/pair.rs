//! What-ifs on a disaggregated [`Cluster`]: built over restored engines, a request sent to a
//! pinned (prefill, decode) pair, and where its two halves got to (what the twin's pair
//! answers read; `twin::pd`).

use super::super::Cluster;
use super::{PdRequest, PdRuntime, Stage};
use crate::cluster::ClusterConfig;
use crate::cluster::disagg::{DisaggConfig, serves_decode, serves_prefill};
use crate::sim::engine::validate_request;
use crate::sim::{Engine, RequestId, RequestSpec, SimError};

/// Where one disaggregated request got to, in cluster time (µs): what a what-if on a pair
/// reads of its two halves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PdProgress {
    /// The prefill instance.
    pub prefill: usize,
    /// The decode instance.
    pub decode: usize,
    /// The prefill half's admission.
    pub prefill_schedule_us: Option<u64>,
    /// The prefill half's (only) token.
    pub prefill_first_token_us: Option<u64>,
    /// The prefill half's end (its response leaves for the decode pod).
    pub prefill_end_us: Option<u64>,
    /// The decode half's arrival at the decode pod.
    pub decode_arrival_us: Option<u64>,
    /// The pull's start (blocks reserved on the decode pod).
    pub transfer_start_us: Option<u64>,
    /// The pull's end.
    pub transfer_end_us: Option<u64>,
    /// The prefill half ended without finishing: the request ended there.
    pub failed_on_prefill: bool,
}

impl Cluster {
    /// A disaggregated cluster over already-built engines (e.g. restored from a snapshot),
    /// one per instance of `config`, all at the same time (see [`Cluster::from_engines`]).
    pub fn from_engines_disaggregated(
        config: ClusterConfig,
        engines: Vec<Engine>,
        disagg: DisaggConfig,
        seed: u64,
    ) -> Result<Self, SimError> {
        let runtime = PdRuntime::new(&config, disagg, seed)?;
        let mut cluster = Cluster::from_engines(config, engines, seed);
        cluster.pd = Some(Box::new(runtime));
        Ok(cluster)
    }

    /// Sends `spec` now as a disaggregated request to the pair (`prefill`, `decode`),
    /// bypassing admission, the profiles and the decider: a what-if ("had the handler
    /// picked this pair") on a fork. The prefill half goes to `prefill` at once; the rest
    /// follows as for a routed request.
    pub fn dispatch_pair(
        &mut self,
        prefill: usize,
        decode: usize,
        spec: RequestSpec,
    ) -> Result<(), SimError> {
        validate_request(&spec, self.now_us)?;
        let count = self.engines.len();
        let bad = |reason: String| SimError::InvalidRequest {
            id: spec.id,
            field: "dispatch_pair",
            reason,
        };
        if self.pd.is_none() {
            return Err(bad("the cluster is not disaggregated".to_owned()));
        }
        if prefill >= count || decode >= count || prefill == decode {
            return Err(bad(format!(
                "needs two distinct instance indices below {count}, got ({prefill}, {decode})"
            )));
        }
        if !serves_prefill(self.config.instances[prefill].role)
            || !serves_decode(self.config.instances[decode].role)
        {
            return Err(bad(format!(
                "instance {prefill} must serve prefill and instance {decode} decode"
            )));
        }
        if spec.arrival_us != self.now_us {
            return Err(bad(format!("needs arrival now ({})", self.now_us)));
        }
        let Some(pd) = self.pd.as_mut() else {
            return Err(bad("the cluster is not disaggregated".to_owned()));
        };
        let id = spec.id;
        pd.requests
            .insert(spec.id, PdRequest::new(spec, prefill, decode));
        self.send_prefill(id);
        Ok(())
    }

    /// Where disaggregated request `id` got to (`None` if the cluster did not split it).
    pub fn pd_progress(&self, id: RequestId) -> Option<PdProgress> {
        let request = self.pd.as_ref()?.requests.get(&id)?;
        Some(PdProgress {
            prefill: request.prefill,
            decode: request.decode,
            prefill_first_token_us: request
                .prefill_record
                .as_ref()
                .and_then(|record| record.first_token_us),
            prefill_schedule_us: request
                .prefill_record
                .as_ref()
                .and_then(|record| record.schedule_us),
            prefill_end_us: request.prefill_record.as_ref().map(|record| record.end_us),
            decode_arrival_us: request.decode_arrival_us,
            transfer_start_us: request.transfer_start_us,
            transfer_end_us: request.transfer_end_us,
            failed_on_prefill: request.stage == Stage::FailedOnPrefill,
        })
    }
}
