//! Embedded reference data (placeholder: to be completed by the latency-model work).
