//! Random number generation policy.
//!
//! Every randomised routine in dprec takes `&mut impl Rng` (or a [`DpRng`]) so that tests
//! and experiments can pass a seeded generator. Production noise comes from
//! [`from_os`]: ChaCha20 (a cryptographically secure stream cipher) keyed from
//! the operating system's entropy source. Seeded runs use the same generator type keyed
//! from the seed, so the code path is identical and only the key differs.

use rand::{RngCore, SeedableRng};

/// The generator used for all privacy noise and all training randomness.
pub type DpRng = rand_chacha::ChaCha20Rng;

/// A generator keyed from the OS entropy source (production noise).
pub fn from_os() -> DpRng {
    DpRng::from_os_rng()
}

/// A generator keyed from a seed (tests, experiments, reproducible evaluation).
pub fn seeded(seed: u64) -> DpRng {
    DpRng::seed_from_u64(seed)
}

/// A generator for a seed when one is given, else from the OS.
pub fn from_seed_or_os(seed: Option<u64>) -> DpRng {
    match seed {
        Some(s) => seeded(s),
        None => from_os(),
    }
}

/// A child generator keyed from 32 bytes of `parent` (always exactly 32 bytes, whatever
/// the child is used for). A mechanism that draws its sampling from one child and its
/// noise from another, both split off before any data is seen, draws the same noise
/// whatever the data (a new user's coin flips do not shift the noise stream).
pub fn split(parent: &mut DpRng) -> DpRng {
    let mut key = [0u8; 32];
    parent.fill_bytes(&mut key);
    DpRng::from_seed(key)
}
