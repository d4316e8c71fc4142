//! Train/test folds.
