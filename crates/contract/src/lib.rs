//! Tool Result v2: what a side-effecting tool call means and how it is bound.
//!
//! This crate is the contract a host, an auditor or a second implementation in another
//! language agree on byte for byte:
//!
//! - the [`Registry`] of tools, their six [`Revisions`], input and output [`Schema`]s,
//!   and the registered [`ProviderProfile`]s;
//! - validated value types ([`Identifier`], [`IdempotencyKey`], [`Sha256Hex`],
//!   [`StatusRef`], [`UnixSeconds`], [`LeaseSeconds`]): checked once, trusted after;
//! - every digest and reference, each from an exact preimage ([`digest`]);
//! - [`Approval`] validation, and each tool's [`ToolRules`] (authorization, the
//!   business precondition, the approval policy) over the current roles a
//!   [`PrincipalResolver`] answers; [`RefundOrder`] is the built-in tool's;
//! - PASS and BLOCK packages and [`verify_package`];
//! - the [`HostCall`] the engine takes, and the case-file and claims-file loaders
//!   ([`load_case`] builds a [`HostCall`] from a file, [`load_claims`]).
//!
//! It does no I/O, reads no clock and knows nothing of SQLite: callers hand it bytes and
//! instants. `docs/contract.md` specifies every preimage; `docs/contract-vectors.json`
//! pins them, and a test regenerates that file from this code.
#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

mod approval;
mod authz;
mod call;
mod case;
mod definition;
pub mod digest;
mod error;
mod ids;
mod package;
mod refund;
mod registry;
mod rules;
mod schema;

pub use crate::{
    approval::{
        Approval, ApprovalBinding, ApprovalBindingRef, ApprovalRefusal, approval_preimage,
        approval_sha256,
    },
    authz::{NoRoles, PrincipalResolver, ResolverError},
    call::{Clock, HostCall, HostContext, Principal, Proposal},
    case::{CASE_VERSION, Claims, load_case, load_claims},
    definition::{
        ApprovalRule, ApprovalValidAt, Authorization, Binding, DEFINITION_BYTES_MAX,
        DefinitionError, ToolDefinition, duplicate_names, is_tool_name, parse_document,
        placeholders,
    },
    digest::{Delivery, HostView, Purpose, Scope},
    error::{BlockCode, ContractError, ErrorCode, InvalidValue},
    ids::{
        DownstreamRequestRef, IdempotencyKey, Identifier, LeaseSeconds, ReceiptRef, Sha256Hex,
        StatusRef, UnixSeconds,
    },
    package::{
        CONTRACT, PackageError, block_package, pass_package, pass_package_from_view,
        pass_package_with_result, verify_package,
    },
    refund::{Order, REFUND_ORDER_DEFINITION, RefundOrder, SUPPORT_ADMIN, orders},
    registry::{
        Charset, DownstreamIdentity, Field, FieldRule, ProviderProfile, Registry, Revisions,
        Schema, SchemaError, ToolSpec, builtin_profiles,
    },
    rules::{ApprovalPolicy, BusinessRefusal, Denied, Precondition, RuleCall, ToolRules, Verdict},
    schema::{
        DRAFT_2020_12, JsonSchema, Rejection, SCHEMA_BYTES_MAX, SCHEMA_DEPTH_MAX, SchemaRefusal,
    },
};
