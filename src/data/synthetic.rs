//! Seeded synthetic rating data.
