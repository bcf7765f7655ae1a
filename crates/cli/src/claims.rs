//! The principal resolver of the command line: the claims file, re-read at every call so
//! a revocation is seen at the next check.

use std::path::{Path, PathBuf};

use toolledger::{
    ContractError, Identifier, NoRoles, PrincipalResolver, ResolverError, load_claims,
};
use toolledger_json::Limits;

use toolledger::{Unreadable, read_bounded};

/// No claims file (nobody holds a role), or one read afresh at every call.
#[derive(Debug, Clone)]
pub(crate) enum Claims {
    None,
    File(PathBuf),
}

/// Why the claims file was refused at the first check.
#[derive(Debug)]
pub(crate) enum Refused {
    Unreadable(Unreadable),
    Invalid(ContractError),
}

impl Claims {
    /// Reads and validates the file once, before anything else is opened, saying why
    /// when it cannot be read.
    pub(crate) fn check(&self) -> Result<(), Refused> {
        match self {
            Claims::None => Ok(()),
            Claims::File(path) => {
                let bytes = read_bounded(path, Limits::default().size_bytes_max)
                    .map_err(Refused::Unreadable)?;
                load_claims(&bytes).map(|_| ()).map_err(Refused::Invalid)
            }
        }
    }
}

/// The file, read afresh and bounded like the first check.
fn load(path: &Path) -> Result<toolledger::Claims, ResolverError> {
    let bytes = read_bounded(path, Limits::default().size_bytes_max).map_err(|why| match why {
        Unreadable::TooLarge { .. } => {
            ResolverError::Invalid("the claims file is larger than the 65536-byte limit".to_owned())
        }
        _ => ResolverError::Unavailable,
    })?;
    load_claims(&bytes).map_err(|err| match err {
        ContractError::ClaimsInvalid { reason } => ResolverError::Invalid(reason),
        _ => ResolverError::Unavailable,
    })
}

impl PrincipalResolver for Claims {
    fn current_roles(
        &self,
        tenant_id: &Identifier,
        subject_id: &Identifier,
    ) -> Result<Vec<String>, ResolverError> {
        match self {
            Claims::None => NoRoles.current_roles(tenant_id, subject_id),
            Claims::File(path) => load(path)?.current_roles(tenant_id, subject_id),
        }
    }
}
