//! The principal resolver: the *current* roles of a principal, asked at every check.
//!
//! Roles are never stored and never read from the call: a [`PrincipalResolver`]
//! answers with the roles a principal holds now, each time it is asked, so a revocation
//! is seen at the next check. What a role allows is a tool's [`ToolRules`](crate::ToolRules).

use crate::Identifier;

/// Why the current roles could not be resolved. The ledger fails closed on it: before
/// an intent is accepted the call is refused; after, the answer is `OUTCOME_UNKNOWN`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResolverError {
    /// The source of roles could not be reached or read (`ROLES_UNAVAILABLE`; the
    /// command line, whose source is its claims file, says `CLAIMS_IO_ERROR`).
    #[error("the principal's roles could not be read")]
    Unavailable,
    /// The source of roles answered something invalid (`ROLES_INVALID`; the command
    /// line says `CLAIMS_INVALID`).
    /// The reason names members only, never values.
    #[error("the principal's roles are invalid: {0}")]
    Invalid(String),
}

/// Answers with the current roles of a principal.
///
/// Called before reservation, again just before the reservation transaction, in the
/// worker before the side effect, and on every replay and status query. An
/// implementation must not cache across calls: revocation has to be seen.
///
/// # Example
///
/// ```
/// use toolledger_contract::{Identifier, PrincipalResolver, ResolverError};
///
/// /// Everyone in tenant `acme` is an agent; nobody else holds a role.
/// #[derive(Debug)]
/// struct AcmeAgents;
///
/// impl PrincipalResolver for AcmeAgents {
///     fn current_roles(
///         &self,
///         tenant_id: &Identifier,
///         _subject_id: &Identifier,
///     ) -> Result<Vec<String>, ResolverError> {
///         Ok(if tenant_id.as_str() == "acme" { vec!["agent".to_owned()] } else { Vec::new() })
///     }
/// }
/// # let _ = AcmeAgents;
/// ```
pub trait PrincipalResolver {
    /// The roles `(tenant_id, subject_id)` holds now. Unknown roles are ignored by the
    /// rules, so an implementation may return whatever its source holds.
    ///
    /// # Errors
    ///
    /// [`ResolverError`] when the source of roles cannot be read or is invalid.
    fn current_roles(
        &self,
        tenant_id: &Identifier,
        subject_id: &Identifier,
    ) -> Result<Vec<String>, ResolverError>;
}

/// A shared resolver is one: what a ledger's callers hold when they share it.
impl<T: PrincipalResolver + ?Sized> PrincipalResolver for &T {
    fn current_roles(
        &self,
        tenant_id: &Identifier,
        subject_id: &Identifier,
    ) -> Result<Vec<String>, ResolverError> {
        (**self).current_roles(tenant_id, subject_id)
    }
}

/// The default resolver: nobody holds any role, so subjects act only on what they own.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoRoles;

impl PrincipalResolver for NoRoles {
    fn current_roles(&self, _: &Identifier, _: &Identifier) -> Result<Vec<String>, ResolverError> {
        Ok(Vec::new())
    }
}
