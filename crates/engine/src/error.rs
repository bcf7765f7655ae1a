//! The engine's error type: failures that are not business answers. BLOCK answers are
//! not errors.

use toolledger_contract::{ErrorCode, ResolverError};
use toolledger_store::StoreError;

/// A failure that is not a business answer: the principal resolver or the store failed.
/// Once an intent is accepted in a call, the engine answers `OUTCOME_UNKNOWN` instead
/// of returning one of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The principal resolver failed.
    #[error(transparent)]
    Resolver(#[from] ResolverError),
    /// The store failed or holds data that contradicts itself.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl EngineError {
    /// The stable code: `ROLES_UNAVAILABLE` or `ROLES_INVALID` for the resolver's,
    /// the store's own otherwise.
    pub fn code(&self) -> ErrorCode {
        match self {
            EngineError::Resolver(ResolverError::Invalid(_)) => ErrorCode::RolesInvalid,
            EngineError::Resolver(_) => ErrorCode::RolesUnavailable,
            EngineError::Store(err) => err.code(),
        }
    }
}
