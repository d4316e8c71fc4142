//! MovieLens loaders.
