//! Reads the catalogue items registered after the served release for the serving layer
//! (`serve::cold`): after each registration through this process, after each release is
//! swapped in, and every `reload_secs` for registrations by other processes.

use std::sync::Arc;

use crate::serve::Registry;
use crate::store::{Store, StoreError};

/// Reads the items registered since the served release started and hands them to the
/// registry, which keeps those outside the release; how many it kept.
pub async fn refresh(store: &Store, registry: &Registry) -> Result<usize, StoreError> {
    let Some(since) = registry.served_since() else {
        return Ok(0);
    };
    let registered = store.items_registered_since(since).await?;
    Ok(registry.set_cold_items(&registered))
}

/// [`refresh`], logging a failure (the previous set stays until the next read).
pub async fn refresh_or_warn(store: &Store, registry: &Registry) {
    if let Err(e) = refresh(store, registry).await {
        log::warn!("reading items registered after the release: {e:#}");
    }
}

/// Every `every`, [`refresh`] (items registered by other processes on the same store).
pub async fn refresh_every(store: Store, registry: Arc<Registry>, every: std::time::Duration) {
    loop {
        tokio::time::sleep(every).await;
        refresh_or_warn(&store, &registry).await;
    }
}
