//! The downstream seam: where the side effect happens.
//!
//! [`Downstream`] is what a host implements over its own client (a payment API, a
//! ticket system): execute a request idempotently on its `downstream_request_ref`, and
//! answer a status lookup. It says what happened in the ways that matter: a receipt
//! (done), or a [`DownstreamError`] — *not sent* (safe to retry), *refused*
//! (definitively, nothing happened), *unknown* (it may have happened), or a *conflict*
//! (the downstream holds another request under this one's ref). It declares a
//! [`DownstreamIdentity`], recorded with every intent at commit A, so an operation is
//! only ever worked by the downstream it was accepted for.
//!
//! This crate is the seam alone, so a downstream (`toolledger-downstream-http`, a host's
//! own) is written without compiling the flows that call it (`toolledger-engine`).
#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

use serde_json::Value;
use toolledger_contract::{
    DownstreamIdentity, DownstreamRequestRef, Sha256Hex, digest::downstream_receipt,
};
use toolledger_store::STAND_IN_NAME;
pub use toolledger_store::{DownstreamReceipt, Now};

/// What the worker asks the downstream to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownstreamRequest {
    /// The scope the downstream must be idempotent on (an HTTP service's
    /// `Idempotency-Key`).
    pub downstream_request_ref: DownstreamRequestRef,
    /// The request digest: the request's fingerprint.
    pub request_sha256: Sha256Hex,
    /// The tool.
    pub tool_name: String,
    /// The output revision the receipt must carry.
    pub output_revision: String,
    /// The arguments, from the ledger.
    pub arguments: Value,
}

impl DownstreamRequest {
    /// The receipt for this request whose output is `output`: what a downstream returns
    /// when the effect is done. `output` must satisfy the tool's output schema (and its
    /// binding to the arguments); a receipt that does not is quarantined, not trusted.
    ///
    /// # Example
    ///
    /// ```
    /// use serde_json::json;
    /// use toolledger_contract::{DownstreamRequestRef, Sha256Hex};
    /// use toolledger_downstream::DownstreamRequest;
    ///
    /// let request = DownstreamRequest {
    ///     downstream_request_ref: DownstreamRequestRef::new(&format!("dr_{}", "0".repeat(32))).unwrap(),
    ///     request_sha256: Sha256Hex::new(&"1".repeat(64)).unwrap(),
    ///     tool_name: "open_ticket".to_owned(),
    ///     output_revision: "open_ticket.output.v1".to_owned(),
    ///     arguments: json!({"queue": "acme-billing", "title": "refund"}),
    /// };
    /// let receipt = request.receipt(json!({"ticket_id": "T-1", "queue": "acme-billing"}));
    /// assert!(receipt.receipt_ref.as_str().starts_with("rc_"));
    /// assert_eq!(receipt.receipt()["output"]["ticket_id"], "T-1");
    /// ```
    pub fn receipt(&self, output: Value) -> DownstreamReceipt {
        let receipt = downstream_receipt(
            self.downstream_request_ref.as_str(),
            &self.request_sha256,
            &self.tool_name,
            &self.output_revision,
            &output,
        );
        DownstreamReceipt::new(
            self.downstream_request_ref.clone(),
            self.request_sha256.clone(),
            &receipt,
        )
    }
}

/// Why a downstream gave no receipt. The four kinds are not interchangeable: each
/// leads to a different, honest state. Deliberately exhaustive: the engine matches
/// every kind, so a new one cannot reach it without a decision about its state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DownstreamError {
    /// The request was certainly not sent (connection refused, DNS, the service said
    /// "busy, same key in flight"). The lease is given back and the operation stays
    /// accepted, to be worked again: `DOWNSTREAM_UNAVAILABLE`.
    #[error("the request was not sent: {reason}")]
    NotSent {
        /// For logs.
        reason: String,
    },
    /// The downstream refused the request definitively ("card declined"): nothing
    /// happened and nothing will. The operation and its event become `failed` with the
    /// reason, and every later read answers `DOWNSTREAM_REFUSED`.
    #[error("the request was refused: {reason}")]
    Refused {
        /// The downstream's reason, kept (bounded to 512 bytes) with the operation.
        reason: String,
    },
    /// The request may have been carried out (a timeout after sending, a reset, a 5xx):
    /// `OUTCOME_UNKNOWN`, settled only by a status query.
    #[error("the outcome is unknown: {reason}")]
    Unknown {
        /// For logs.
        reason: String,
    },
    /// The downstream holds a different request under this request's ref: it is not
    /// idempotent on the scope it was handed, and nothing may retry this under another
    /// key (`STORE_CONTRACT_VIOLATION`).
    #[error("the downstream holds a different request under this ref")]
    Conflict,
}

/// What a status lookup learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The effect happened: here is its receipt.
    Done(DownstreamReceipt),
    /// The downstream refused this request definitively.
    Refused {
        /// The downstream's reason.
        reason: String,
    },
    /// The downstream has no record of the request.
    NotFound,
}

/// A system that performs side effects, idempotently per `downstream_request_ref`.
///
/// Every method takes `&self`: one ledger shared by many callers calls its downstream
/// from each caller's thread at once, and never under a lock of the ledger's. A
/// downstream that holds something it cannot share (a connection, a counter) guards
/// it itself, for as short a time as it can.
pub trait Downstream {
    /// Who this is: recorded with every intent it is to perform.
    fn identity(&self) -> &DownstreamIdentity;

    /// Who performs `tool`'s effects: [`Downstream::identity`] unless this downstream
    /// routes tools to several services, each of its own identity. Commit A records it,
    /// and every later step compares the operation's with it.
    fn identity_for(&self, tool: &str) -> &DownstreamIdentity {
        let _ = tool;
        self.identity()
    }

    /// Every identity [`Downstream::identity_for`] answers: a relay claims the events of
    /// each, and no other.
    fn identities(&self) -> Vec<DownstreamIdentity> {
        vec![self.identity().clone()]
    }

    /// Performs `request` (or, if this ref was seen, returns the first receipt).
    ///
    /// # Errors
    ///
    /// [`DownstreamError`], saying whether the request was not sent, refused, or may
    /// have been carried out.
    fn execute(
        &self,
        request: &DownstreamRequest,
        now: Now,
    ) -> Result<DownstreamReceipt, DownstreamError>;

    /// What became of `request`, by its ref.
    ///
    /// # Errors
    ///
    /// [`DownstreamError`] when the downstream cannot be asked; the outcome stays
    /// unknown.
    fn lookup(&self, request: &DownstreamRequest) -> Result<Lookup, DownstreamError>;

    /// Whether [`Downstream::lookup`] can find `tool`'s requests (the default). A
    /// success's commit C is then written without waiting for the disk: a power loss
    /// that takes it back leaves an operation a status query settles from the
    /// downstream's receipt. A downstream that cannot look `tool`'s requests up answers
    /// `false`, and each of its successes is synced before it is answered.
    fn can_look_up(&self, tool: &str) -> bool {
        let _ = tool;
        true
    }

    /// Whether this is the offline simulation (the engine's `StandIn`): the only downstream that may
    /// declare the stand-in's identity (`toolledger-stand-in`). The identity says who
    /// performs an operation, so a real service declaring it would perform operations
    /// accepted for the simulation, and the simulation would finish the service's with
    /// nothing sent; see [`reserved_identity`]. A decorator answers for what it wraps.
    fn is_simulation(&self) -> bool {
        false
    }

    /// Performs several requests, answering each in order: what a relay hands its
    /// downstream for one batch. The default performs them one by one; a downstream
    /// that can commit several at once overrides it (a real one commits on its own, as
    /// it always does).
    fn execute_batch(
        &self,
        requests: &[DownstreamRequest],
        now: Now,
    ) -> Vec<Result<DownstreamReceipt, DownstreamError>> {
        requests.iter().map(|request| self.execute(request, now)).collect()
    }
}

/// A downstream whose client is async (an async HTTP client, a gRPC stub): the same
/// contract as [`Downstream`], with `execute` and `lookup` futures. A ledger opened
/// with one (the facade's `LedgerBuilder::open_async`) runs them on the host's own
/// tokio runtime, while the ledger's disk work stays off the runtime's threads.
///
/// ```
/// use toolledger_contract::DownstreamIdentity;
/// use toolledger_downstream::{AsyncDownstream, DownstreamError, DownstreamRequest, Lookup};
/// # use toolledger_store::{DownstreamReceipt, Now};
/// struct Payments(DownstreamIdentity);
/// impl AsyncDownstream for Payments {
///     fn identity(&self) -> &DownstreamIdentity { &self.0 }
///     async fn execute(&self, request: &DownstreamRequest, _: Now) -> Result<DownstreamReceipt, DownstreamError> {
///         // `client.post(...).header("Idempotency-Key", ...).send().await` in a real one.
///         Ok(request.receipt(serde_json::json!({"payment_id": "pay-1"})))
///     }
///     async fn lookup(&self, _: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
///         Ok(Lookup::NotFound)
///     }
/// }
/// # let _ = Payments(DownstreamIdentity::new("payments", "1").unwrap());
/// ```
pub trait AsyncDownstream: Send + Sync + 'static {
    /// As [`Downstream::identity`].
    fn identity(&self) -> &DownstreamIdentity;

    /// As [`Downstream::identity_for`].
    fn identity_for(&self, tool: &str) -> &DownstreamIdentity {
        let _ = tool;
        self.identity()
    }

    /// As [`Downstream::identities`].
    fn identities(&self) -> Vec<DownstreamIdentity> {
        vec![self.identity().clone()]
    }

    /// As [`Downstream::execute`].
    fn execute(
        &self,
        request: &DownstreamRequest,
        now: Now,
    ) -> impl Future<Output = Result<DownstreamReceipt, DownstreamError>> + Send;

    /// As [`Downstream::lookup`].
    fn lookup(
        &self,
        request: &DownstreamRequest,
    ) -> impl Future<Output = Result<Lookup, DownstreamError>> + Send;

    /// As [`Downstream::can_look_up`].
    fn can_look_up(&self, tool: &str) -> bool {
        let _ = tool;
        true
    }
}

/// A shared downstream is one: what a ledger's callers hold when they share it.
impl<T: Downstream + ?Sized> Downstream for &T {
    fn identity(&self) -> &DownstreamIdentity {
        (**self).identity()
    }

    fn identity_for(&self, tool: &str) -> &DownstreamIdentity {
        (**self).identity_for(tool)
    }

    fn identities(&self) -> Vec<DownstreamIdentity> {
        (**self).identities()
    }

    fn execute(
        &self,
        request: &DownstreamRequest,
        now: Now,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        (**self).execute(request, now)
    }

    fn lookup(&self, request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        (**self).lookup(request)
    }

    fn can_look_up(&self, tool: &str) -> bool {
        (**self).can_look_up(tool)
    }

    fn is_simulation(&self) -> bool {
        (**self).is_simulation()
    }

    fn execute_batch(
        &self,
        requests: &[DownstreamRequest],
        now: Now,
    ) -> Vec<Result<DownstreamReceipt, DownstreamError>> {
        (**self).execute_batch(requests, now)
    }
}

/// Whether `downstream` declares an identity it may not: the stand-in's name
/// (`toolledger-stand-in`, at any revision) on anything but the simulation. Every ledger
/// refuses to open with such a downstream, before anything is accepted for it.
///
/// ```
/// use toolledger_contract::DownstreamIdentity;
/// use toolledger_downstream::{Downstream, DownstreamError, DownstreamRequest, Lookup, reserved_identity};
/// # use toolledger_store::{DownstreamReceipt, Now};
/// struct Impostor(DownstreamIdentity);
/// impl Downstream for Impostor {
///     fn identity(&self) -> &DownstreamIdentity { &self.0 }
///     fn execute(&self, _: &DownstreamRequest, _: Now) -> Result<DownstreamReceipt, DownstreamError> {
///         Err(DownstreamError::NotSent { reason: "never".to_owned() })
///     }
///     fn lookup(&self, _: &DownstreamRequest) -> Result<Lookup, DownstreamError> { Ok(Lookup::NotFound) }
/// }
/// let stand_in = DownstreamIdentity::new("toolledger-stand-in", "1").unwrap();
/// assert!(reserved_identity(&Impostor(stand_in)));
/// let payments = DownstreamIdentity::new("acme-payments", "1").unwrap();
/// assert!(!reserved_identity(&Impostor(payments)));
/// ```
pub fn reserved_identity(downstream: &impl Downstream) -> bool {
    let declared = std::iter::once(downstream.identity().clone()).chain(downstream.identities());
    !downstream.is_simulation() && declared.into_iter().any(|id| id.name() == STAND_IN_NAME)
}
