//! A served ranker as a release stores it and a restarted service reloads it: the closed
//! set of ranker models the service can serve, read from any [`Ranker`] by its concrete
//! type (so the models need not know this list, and the list knows them).

use crate::model::item_ranker::ItemRanker;
use crate::model::joint_als::JointAls;
use crate::model::labels::LabelledRanker;
use crate::model::nbm::NbmModel;
use crate::model::ranker::Ranker;

/// A served ranker as stored with its release (JSON inside the model column).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum StoredRanker {
    /// An item-side model over DP-popular candidates ([`ItemRanker`]).
    Item { model: ItemRanker },
    /// A neighbourhood model (`dpsgd-nbm`, `dpps-nbm`, `nbm`): its DP biases and
    /// item-anchor weights, nothing per user ([`NbmModel`]).
    Nbm { model: NbmModel },
    /// A joint-DP rating predictor (`dp-alt`): the DP item side; each user's profile is
    /// solved from it and the user's own ratings ([`JointAls`]).
    JointAls { model: JointAls },
    /// An item-side model with a label model over the public catalogue labels
    /// ([`LabelledRanker`]).
    Labelled { model: LabelledRanker },
}

impl StoredRanker {
    /// `ranker` in its stored form; `None` for a model that is not stored through a ranker.
    pub fn of(ranker: &dyn Ranker) -> Option<StoredRanker> {
        let any = ranker.storable()?;
        if let Some(m) = any.downcast_ref::<ItemRanker>() {
            return Some(StoredRanker::Item { model: m.clone() });
        }
        if let Some(m) = any.downcast_ref::<LabelledRanker>() {
            return Some(StoredRanker::Labelled { model: m.clone() });
        }
        if let Some(m) = any.downcast_ref::<NbmModel>() {
            return Some(StoredRanker::Nbm { model: m.clone() });
        }
        any.downcast_ref::<JointAls>()
            .map(|m| StoredRanker::JointAls { model: m.clone() })
    }

    /// The ranker a service answers with.
    pub fn into_ranker(self) -> std::sync::Arc<dyn Ranker> {
        match self {
            StoredRanker::Item { model } => std::sync::Arc::new(model),
            StoredRanker::Nbm { model } => std::sync::Arc::new(model),
            StoredRanker::JointAls { model } => std::sync::Arc::new(model),
            StoredRanker::Labelled { model } => std::sync::Arc::new(model),
        }
    }
}
