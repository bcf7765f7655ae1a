//! The engine's error type: the exit-2 failures. BLOCK answers are not errors.

use toolledger_contract::ContractError;
use toolledger_store::StoreError;

/// A failure that is not a business answer: the claims source or the store failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The principal resolver failed (claims file unreadable or invalid).
    #[error(transparent)]
    Contract(#[from] ContractError),
    /// The store failed or holds data that contradicts itself.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl EngineError {
    /// The stable code the CLI prints.
    pub fn code(&self) -> &'static str {
        match self {
            EngineError::Contract(err) => err.code(),
            EngineError::Store(err) => err.code(),
        }
    }
}
