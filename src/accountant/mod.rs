//! Renyi-DP accounting (pure functions, no I/O).
