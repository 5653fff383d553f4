//! The command line (placeholder).
