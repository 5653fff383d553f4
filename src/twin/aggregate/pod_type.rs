//! A pod's role in prefill/decode disaggregation, as the EPP sends it, and what it means
//! for the phases an entry predicts and teaches.

use crate::cluster::config::InstanceRole;

use super::{AggregatePrediction, Estimate};

/// A pod's role in prefill/decode disaggregation (the peer's `pod_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodType {
    /// `""`: serves both phases.
    Monolithic,
    /// `"prefill"`: its latency of interest is TTFT.
    Prefill,
    /// `"decode"`: its latency of interest is TPOT.
    Decode,
}

/// The `pod_type` spellings accepted, as the EPP sends them: the value of the pod's role
/// label (`endpointRoleLabel`, by default llm-d's `llm-d.ai/role`), or `""` when the pod has
/// none. llm-d's role values: `prefill` and `encode-prefill` prefill only; `decode` and
/// `encode-decode` decode only; `prefill-decode`, `encode-prefill-decode` and the deprecated
/// `both` serve both phases, as does `monolithic` (the peer's own load test sends it). An
/// encode-only pod (`encode`) has no latency this API predicts.
pub const POD_TYPES: &str = "'', 'monolithic', 'both', 'prefill-decode', \
     'encode-prefill-decode', 'prefill', 'encode-prefill', 'decode' or 'encode-decode'";

impl PodType {
    /// Parses a role as the EPP sends it (see [`POD_TYPES`]); `None` for anything else.
    pub fn parse(text: &str) -> Option<PodType> {
        match text {
            "" | "monolithic" | "both" | "prefill-decode" | "encode-prefill-decode" => {
                Some(PodType::Monolithic)
            }
            "prefill" | "encode-prefill" => Some(PodType::Prefill),
            "decode" | "encode-decode" => Some(PodType::Decode),
            _ => None,
        }
    }

    /// The peer's own spelling of this pod type (`""` for monolithic).
    pub fn as_str(self) -> &'static str {
        match self {
            PodType::Monolithic => "",
            PodType::Prefill => "prefill",
            PodType::Decode => "decode",
        }
    }

    /// The mirrored instance role entries of this pod type are matched to and simulated on.
    pub fn role(self) -> InstanceRole {
        match self {
            PodType::Monolithic => InstanceRole::Both,
            PodType::Prefill => InstanceRole::Prefill,
            PodType::Decode => InstanceRole::Decode,
        }
    }

    /// A prediction with the phases this pod type does not serve made neutral: a prefill
    /// pod's TPOT is 0 with no spread (it generates one token; the EPP neutralises its TPOT
    /// too), so no TPOT SLO is ever missed there.
    pub fn neutralise(self, mut prediction: AggregatePrediction) -> AggregatePrediction {
        if !self.carries_tpot() {
            prediction.tpot = Estimate::default();
        }
        prediction
    }

    /// Whether entries of this pod type carry a TTFT worth learning from.
    pub fn carries_ttft(self) -> bool {
        matches!(self, PodType::Monolithic | PodType::Prefill)
    }

    /// Whether entries of this pod type carry a TPOT worth learning from.
    pub fn carries_tpot(self) -> bool {
        matches!(self, PodType::Monolithic | PodType::Decode)
    }
}
