//! KV-cache capacity derived from GPU memory (placeholder: completed by the latency-model work).
