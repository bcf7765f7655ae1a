//! What toolledger's tests and benches share, kept out of the published crates: a
//! throwaway PostgreSQL cluster ([`cluster`]), a temporary directory removed when dropped
//! ([`TempDir`]), and the address a server this workspace built announces when it starts
//! ([`listening_base`]), and the intent a case's dispatch accepts ([`intent_of`]).
#![deny(missing_docs)]

pub mod cluster;

use std::{
    io::BufRead,
    path::{Path, PathBuf},
    process::Child,
};

use toolledger_contract::{DownstreamIdentity, HostCall, Revisions, Scope, digest};
use toolledger_store::{CallIdentity, NewOperation};

/// A directory of its own under the system's temporary directory, removed (with
/// everything in it) when dropped.
#[derive(Debug)]
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    /// A new directory whose name starts with `toolledger-` and `name`.
    ///
    /// # Panics
    ///
    /// When the directory cannot be made: a test cannot run without it.
    #[allow(clippy::expect_used, reason = "a test's setup: failing loudly is the point")]
    pub fn new(name: &str) -> TempDir {
        let prefix = format!("toolledger-{name}-");
        TempDir(tempfile::Builder::new().prefix(&prefix).tempdir().expect("a temporary directory"))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// `name` inside the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
}

/// The base URL (`http://ADDR`) of a server this workspace built (the reference service,
/// `toolledger serve`), read from the first line it prints on its standard output,
/// `listening on ADDR`. The child's standard output must be piped; it is taken.
///
/// # Panics
///
/// When the server printed anything else first, or nothing: the test cannot reach it.
#[allow(clippy::expect_used, clippy::panic, reason = "a test's setup: failing loudly is the point")]
pub fn listening_base(child: &mut Child) -> String {
    let stdout = child.stdout.take().expect("the server's standard output is piped");
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line).expect("the server's first line");
    let Some(addr) = line.trim().strip_prefix("listening on ") else {
        panic!("the server's first line is not `listening on ADDR`: {line:?}");
    };
    format!("http://{addr}")
}

/// What a dispatch of `case` accepts as a new intent for the tool `tool` at `revisions`,
/// performed by `downstream`, built with the contract's own digests: the intent, with the
/// case's approval (if any) bound to it, and the identity of the model call that proposed
/// it.
pub fn intent_of(
    case: &HostCall,
    tool: &str,
    revisions: &Revisions,
    downstream: DownstreamIdentity,
) -> (NewOperation, CallIdentity) {
    let scope = Scope {
        tenant_id: case.principal.tenant_id.clone(),
        subject_id: case.principal.subject_id.clone(),
        tool_name: tool.to_owned(),
        idempotency_key: case.host.idempotency_key.clone(),
    };
    let arguments = case.proposal.arguments.clone();
    let request =
        digest::request_sha256(&scope.tenant_id, &scope.subject_id, tool, &arguments, revisions);
    let mut approval = case.approval.clone();
    if let Some(approval) = &mut approval {
        approval.approval_sha256 = approval.digest_for(&case.approval_binding(tool, revisions));
    }
    let host = &case.host;
    let call = CallIdentity {
        profile: host.profile.clone(),
        provider_response_id: host.provider_response_id.clone(),
        provider_call_id: host.provider_call_id.clone(),
    };
    let intent = NewOperation {
        status_ref: digest::status_ref(&scope),
        request_sha256: request,
        arguments,
        revisions: revisions.clone(),
        profile: host.profile.clone(),
        provider_response_id: host.provider_response_id.clone(),
        provider_call_id: host.provider_call_id.clone(),
        operation_id: host.operation_id.clone(),
        approval,
        downstream,
        scope,
    };
    (intent, call)
}
