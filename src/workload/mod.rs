//! Workload specs and generators (placeholder: to be completed by the workload work).
