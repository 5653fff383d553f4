//! The KV transfer model a pair fork runs with: the configured connector and link (the
//! snapshot's `disaggregation` settings, else every default), scaled by what the decode pod
//! measured of its own pulls (`cluster::transfer_fit`, docs/disaggregation.md "Fitted from
//! the pods").

use crate::cluster::disagg::{DisaggConfig, TransferModel};

use super::error::TwinError;
use super::snapshot::MirrorSnapshot;

/// The disaggregation settings pair forks run with: the snapshot's, else every default (as
/// `ditto run --routing pd`).
pub fn configured(snapshot: &MirrorSnapshot) -> Result<DisaggConfig, TwinError> {
    match &snapshot.settings.disaggregation {
        Some(settings) => Ok(settings.config.clone()),
        None => crate::cluster::spec::resolve_disaggregation(
            &crate::cluster::spec::DisaggSpec::default(),
            Vec::new(),
        )
        .map_err(|err| TwinError::Unsimulable(format!("default disaggregation: {err}"))),
    }
}

/// The transfer model for pulls into the decode pod at `decode` (its index in the snapshot):
/// `configured`'s, scaled by the pod's fit once it has seen enough pulls.
pub fn for_decode(
    snapshot: &MirrorSnapshot,
    configured: &TransferModel,
    decode: usize,
) -> TransferModel {
    snapshot
        .instances
        .get(decode)
        .and_then(|state| state.transfer_fit.as_ref())
        .map_or(*configured, |fit| fit.apply(configured))
}
