//! Evaluation: cross validation, metrics, reports and plots.
