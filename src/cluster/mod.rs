//! The cluster: many instances behind an llm-d-style router, with admission and stale
//! signals. (Being built.)

pub mod config;
