//! The principal resolver of the command line: the claims file, re-read at every call so
//! a revocation is seen at the next check.

use std::path::PathBuf;

use toolledger_contract::{ContractError, Identifier, NoRoles, PrincipalResolver, load_claims};

/// No claims file (nobody holds a role), or one read afresh at every call.
#[derive(Debug, Clone)]
pub(crate) enum Claims {
    None,
    File(PathBuf),
}

impl Claims {
    /// Reads and validates the file once, before anything else is opened.
    pub(crate) fn check(&self) -> Result<(), ContractError> {
        match self {
            Claims::None => Ok(()),
            Claims::File(path) => load(path).map(|_| ()),
        }
    }
}

fn load(path: &PathBuf) -> Result<toolledger_contract::Claims, ContractError> {
    let bytes = std::fs::read(path).map_err(|_| ContractError::ClaimsIo)?;
    load_claims(&bytes)
}

impl PrincipalResolver for Claims {
    fn current_roles(
        &self,
        tenant_id: &Identifier,
        subject_id: &Identifier,
    ) -> Result<Vec<String>, ContractError> {
        match self {
            Claims::None => NoRoles.current_roles(tenant_id, subject_id),
            Claims::File(path) => load(path)?.current_roles(tenant_id, subject_id),
        }
    }
}
