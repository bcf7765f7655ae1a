//! The crate's error type and the stable codes: [`BlockCode`] (business answers, exit 1)
//! and [`ErrorCode`] (errors, exit 2).

/// Why a case file, claims file or stored value was refused.
///
/// Messages are fixed words plus the names of the *schema's* members (never the input's
/// values, never a path), so they are safe to print.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContractError {
    /// The case file is not a valid `persistence-case/v1` document.
    #[error("case file invalid: {reason}")]
    FixtureInvalid {
        /// What was wrong, naming only schema members.
        reason: String,
    },
    /// The claims file is not a valid claims document.
    #[error("claims file invalid: {reason}")]
    ClaimsInvalid {
        /// What was wrong, naming only schema members.
        reason: String,
    },
    /// The claims file could not be read.
    #[error("claims file could not be read")]
    ClaimsIo,
}

impl ContractError {
    /// The stable code: `FIXTURE_INVALID`, `CLAIMS_INVALID` or `CLAIMS_IO_ERROR`.
    pub fn code(&self) -> ErrorCode {
        match self {
            ContractError::FixtureInvalid { .. } => ErrorCode::FixtureInvalid,
            ContractError::ClaimsInvalid { .. } => ErrorCode::ClaimsInvalid,
            ContractError::ClaimsIo => ErrorCode::ClaimsIoError,
        }
    }
}

/// The error codes: failures that are not business answers. The command line answers
/// them on stderr with exit 2, which promises that nothing was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The case file could not be read (not found, permission, not a regular file).
    FixtureIoError,
    /// The case file is not a valid `persistence-case/v1` document.
    FixtureInvalid,
    /// The claims file could not be read.
    ClaimsIoError,
    /// The claims file is not a valid claims document.
    ClaimsInvalid,
    /// A host's role resolver could not reach or read its source of roles. (The command
    /// line's resolver is its claims file: it answers `CLAIMS_IO_ERROR` instead.)
    RolesUnavailable,
    /// A host's role resolver answered something invalid. (The command line answers
    /// `CLAIMS_INVALID` instead.)
    RolesInvalid,
    /// The store failed (not a database, I/O, a full disk, an internal invariant).
    StoreError,
    /// Another connection held a lock past the wait bound.
    StoreBusy,
    /// A command that never creates a ledger (`status`, `process`, `audit`, `list`,
    /// `show`, `metrics`, …) was pointed at a location that holds none.
    StoreNotFound,
    /// The file is not a store of this schema version (an older one needs `migrate`).
    SchemaUnsupported,
    /// A stored row contradicts itself.
    StoreContractViolation,
    /// The command line was used wrongly.
    UsageError,
    /// A bug stopped the command.
    InternalError,
}

impl ErrorCode {
    /// Every code, in documentation order.
    pub const ALL: [ErrorCode; 13] = [
        ErrorCode::FixtureIoError,
        ErrorCode::FixtureInvalid,
        ErrorCode::ClaimsIoError,
        ErrorCode::ClaimsInvalid,
        ErrorCode::RolesUnavailable,
        ErrorCode::RolesInvalid,
        ErrorCode::StoreError,
        ErrorCode::StoreBusy,
        ErrorCode::StoreNotFound,
        ErrorCode::SchemaUnsupported,
        ErrorCode::StoreContractViolation,
        ErrorCode::UsageError,
        ErrorCode::InternalError,
    ];

    /// The stable code, e.g. `STORE_BUSY`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::FixtureIoError => "FIXTURE_IO_ERROR",
            ErrorCode::FixtureInvalid => "FIXTURE_INVALID",
            ErrorCode::ClaimsIoError => "CLAIMS_IO_ERROR",
            ErrorCode::ClaimsInvalid => "CLAIMS_INVALID",
            ErrorCode::RolesUnavailable => "ROLES_UNAVAILABLE",
            ErrorCode::RolesInvalid => "ROLES_INVALID",
            ErrorCode::StoreError => "STORE_ERROR",
            ErrorCode::StoreBusy => "STORE_BUSY",
            ErrorCode::StoreNotFound => "STORE_NOT_FOUND",
            ErrorCode::SchemaUnsupported => "SCHEMA_UNSUPPORTED",
            ErrorCode::StoreContractViolation => "STORE_CONTRACT_VIOLATION",
            ErrorCode::UsageError => "USAGE_ERROR",
            ErrorCode::InternalError => "INTERNAL_ERROR",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A code compares equal to its stable text, so `err.code() == "STORE_BUSY"` reads as
/// the documentation does.
impl PartialEq<&str> for ErrorCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// A value that does not satisfy its type's rule (see [`Identifier`](crate::Identifier) and its siblings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not a valid {what}")]
pub struct InvalidValue {
    /// The kind of value that was expected, e.g. `identifier`.
    pub what: &'static str,
}

/// The BLOCK codes (`docs/contract.md`): refusals a caller acts on, answered on stdout with exit 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BlockCode {
    /// The side effect may or may not have happened; only a status query settles it.
    OutcomeUnknown,
    /// The key is already bound to a different intent or contract.
    IdempotencyConflict,
    /// A call identity recorded for one purpose was used for another.
    CallPurposeConflict,
    /// The resource or operation does not exist for this principal (or is not theirs).
    NotFound,
    /// The worker's re-authorization failed.
    AuthorizationDenied,
    /// The approval is not eligible, not bound to this call, or not yet valid.
    ApprovalInvalid,
    /// The approval's validity ended.
    ApprovalExpired,
    /// The tool needs a person's approval and none was given (the person declined, or
    /// could not be asked): nothing was accepted or sent. A frontend that asks the
    /// person itself (the MCP gateway, a framework's approval flow) answers it.
    ApprovalRequired,
    /// The business state does not allow the effect.
    BusinessStateInvalid,
    /// The proposal names an unknown tool or its arguments fail the input schema.
    InputInvalid,
    /// The stored operation's contract differs from the current registry.
    ContractDrift,
    /// Another worker holds an unexpired lease.
    LeaseHeld,
    /// The store audit found a problem.
    AuditFailed,
    /// The model call is already recorded as the dispatch of another operation: one
    /// model call is one intent.
    CallReused,
    /// The downstream refused the request definitively: nothing happened, and the
    /// operation is `failed` for good (its replays answer this again).
    DownstreamRefused,
    /// The downstream's receipt broke the tool's output contract after the effect: the
    /// operation is `quarantined` for a person to look at.
    ReceiptQuarantined,
    /// The operation belongs to another downstream than the one asked to work it.
    DownstreamMismatch,
    /// The downstream could not be reached and the request was not sent: nothing
    /// happened, and the operation stays accepted, to be worked again.
    DownstreamUnavailable,
    /// The key belonged to an operation that retention removed: using it again is a new
    /// business decision, made with a new key.
    KeyRetired,
    /// Only a dead or failed operation can be requeued.
    NotRequeueable,
    /// Only an operation that has not ended can be resolved by hand.
    NotResolvable,
    /// The intent is accepted and queued, and nothing was sent yet (`enqueue`): a worker
    /// or the relay performs it. Not a failure and not an unknown outcome.
    Accepted,
}

impl BlockCode {
    /// Every code, in the contract's order.
    pub const ALL: [BlockCode; 22] = [
        BlockCode::OutcomeUnknown,
        BlockCode::IdempotencyConflict,
        BlockCode::CallPurposeConflict,
        BlockCode::NotFound,
        BlockCode::AuthorizationDenied,
        BlockCode::ApprovalInvalid,
        BlockCode::ApprovalExpired,
        BlockCode::ApprovalRequired,
        BlockCode::BusinessStateInvalid,
        BlockCode::InputInvalid,
        BlockCode::ContractDrift,
        BlockCode::LeaseHeld,
        BlockCode::AuditFailed,
        BlockCode::CallReused,
        BlockCode::DownstreamRefused,
        BlockCode::ReceiptQuarantined,
        BlockCode::DownstreamMismatch,
        BlockCode::DownstreamUnavailable,
        BlockCode::KeyRetired,
        BlockCode::NotRequeueable,
        BlockCode::NotResolvable,
        BlockCode::Accepted,
    ];

    /// The stable code, e.g. `OUTCOME_UNKNOWN`.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockCode::OutcomeUnknown => "OUTCOME_UNKNOWN",
            BlockCode::IdempotencyConflict => "IDEMPOTENCY_CONFLICT",
            BlockCode::CallPurposeConflict => "CALL_PURPOSE_CONFLICT",
            BlockCode::NotFound => "NOT_FOUND",
            BlockCode::AuthorizationDenied => "AUTHORIZATION_DENIED",
            BlockCode::ApprovalInvalid => "APPROVAL_INVALID",
            BlockCode::ApprovalExpired => "APPROVAL_EXPIRED",
            BlockCode::ApprovalRequired => "APPROVAL_REQUIRED",
            BlockCode::BusinessStateInvalid => "BUSINESS_STATE_INVALID",
            BlockCode::InputInvalid => "INPUT_INVALID",
            BlockCode::ContractDrift => "CONTRACT_DRIFT",
            BlockCode::LeaseHeld => "LEASE_HELD",
            BlockCode::AuditFailed => "AUDIT_FAILED",
            BlockCode::CallReused => "CALL_REUSED",
            BlockCode::DownstreamRefused => "DOWNSTREAM_REFUSED",
            BlockCode::ReceiptQuarantined => "RECEIPT_QUARANTINED",
            BlockCode::DownstreamMismatch => "DOWNSTREAM_MISMATCH",
            BlockCode::DownstreamUnavailable => "DOWNSTREAM_UNAVAILABLE",
            BlockCode::KeyRetired => "KEY_RETIRED",
            BlockCode::NotRequeueable => "NOT_REQUEUEABLE",
            BlockCode::NotResolvable => "NOT_RESOLVABLE",
            BlockCode::Accepted => "ACCEPTED",
        }
    }

    /// The fixed sentence a BLOCK package carries for this code. It never echoes input.
    pub fn message(self) -> &'static str {
        match self {
            BlockCode::OutcomeUnknown => {
                "the outcome is not known locally; do not retry with a new key: query the status_ref"
            }
            BlockCode::IdempotencyConflict => {
                "this idempotency key is already bound to a different request or contract"
            }
            BlockCode::CallPurposeConflict => {
                "this provider call identity was already recorded for another purpose"
            }
            BlockCode::NotFound => "no such resource or operation for this principal",
            BlockCode::AuthorizationDenied => {
                "the current principal may no longer perform this operation; it stays recoverable"
            }
            BlockCode::ApprovalInvalid => {
                "the approval is not eligible, not bound to this call, or not yet valid"
            }
            BlockCode::ApprovalExpired => "the approval has expired",
            BlockCode::ApprovalRequired => {
                "this tool needs a person's approval and none was given; nothing was accepted or sent"
            }
            BlockCode::BusinessStateInvalid => "the business state does not allow this operation",
            BlockCode::InputInvalid => {
                "the proposal names an unknown tool or fails its input schema"
            }
            BlockCode::ContractDrift => {
                "the operation was accepted under a contract that differs from the current registry"
            }
            BlockCode::LeaseHeld => "another worker holds the lease on this operation",
            BlockCode::AuditFailed => "the store audit found problems",
            BlockCode::CallReused => {
                "this model call already dispatched another operation; one call is one intent"
            }
            BlockCode::DownstreamRefused => {
                "the downstream refused this request definitively; nothing happened and it will not be retried"
            }
            BlockCode::ReceiptQuarantined => {
                "the downstream's receipt breaks the tool's output contract; the operation is quarantined for review"
            }
            BlockCode::DownstreamMismatch => {
                "this operation belongs to another downstream than the one asked to work it"
            }
            BlockCode::DownstreamUnavailable => {
                "the downstream could not be reached and nothing was sent; the operation stays accepted: work it again by its status_ref"
            }
            BlockCode::KeyRetired => {
                "this key belonged to an operation removed by retention; a new intent needs a new key"
            }
            BlockCode::NotRequeueable => "only a dead or failed operation can be requeued",
            BlockCode::NotResolvable => {
                "the operation has already ended; only a pending or unknown one is resolved by hand"
            }
            BlockCode::Accepted => {
                "the intent is accepted and queued; nothing was sent yet: a worker performs it, and a status query tells what became of it"
            }
        }
    }
}

impl std::fmt::Display for BlockCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
