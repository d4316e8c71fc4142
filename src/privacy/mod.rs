//! Privacy mechanisms: pure noise samplers and sampling primitives (no I/O).
