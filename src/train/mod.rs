//! Trainers.
