//! The downstream: where the side effect happens.
//!
//! [`Downstream`] is what a host implements over its own client (a payment API, a
//! ticket system): execute a request idempotently on its `downstream_request_ref`, and
//! answer a status lookup. It says what happened in the three ways that matter:
//! a receipt (done), or a [`DownstreamError`] — *not sent* (safe to retry), *refused*
//! (definitively, nothing happened), *unknown* (it may have happened). It declares a
//! [`DownstreamIdentity`], recorded with every intent at commit A, so an operation is
//! only ever worked by the downstream it was accepted for.
//!
//! [`StandIn`] is the offline simulation the command line uses: it commits its receipt
//! in its own transaction (commit B) in the store's `downstream_receipts` table,
//! returns the first receipt for a repeated ref, and refuses a different request under
//! the same ref.

use serde_json::{Value, json};
use toolledger_contract::{
    DownstreamIdentity, Sha256Hex,
    digest::{downstream_receipt, downstream_receipt_ref, refund_id},
};
use toolledger_store::{
    DownstreamReceipt, Now, STAND_IN_NAME, STAND_IN_REVISION, StandInReceipts, StoreError,
};

/// What the worker asks the downstream to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownstreamRequest {
    /// The scope the downstream must be idempotent on (an HTTP service's
    /// `Idempotency-Key`).
    pub downstream_request_ref: String,
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
    /// use toolledger_contract::Sha256Hex;
    /// use toolledger_engine::DownstreamRequest;
    ///
    /// let request = DownstreamRequest {
    ///     downstream_request_ref: format!("dr_{}", "0".repeat(32)),
    ///     request_sha256: Sha256Hex::new(&"1".repeat(64)).unwrap(),
    ///     tool_name: "open_ticket".to_owned(),
    ///     output_revision: "open_ticket.output.v1".to_owned(),
    ///     arguments: json!({"queue": "acme-billing", "title": "refund"}),
    /// };
    /// let receipt = request.receipt(json!({"ticket_id": "T-1", "queue": "acme-billing"}));
    /// assert!(receipt.receipt_ref.starts_with("rc_"));
    /// assert_eq!(receipt.receipt["output"]["ticket_id"], "T-1");
    /// ```
    pub fn receipt(&self, output: Value) -> DownstreamReceipt {
        let receipt = downstream_receipt(
            &self.downstream_request_ref,
            &self.request_sha256,
            &self.tool_name,
            &self.output_revision,
            &output,
        );
        let receipt_ref = downstream_receipt_ref(&receipt);
        DownstreamReceipt {
            downstream_request_ref: self.downstream_request_ref.clone(),
            request_sha256: self.request_sha256.clone(),
            receipt,
            receipt_ref,
        }
    }
}

/// Why a downstream gave no receipt. The three kinds are not interchangeable: each
/// leads to a different, honest state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
        &mut self,
        request: &DownstreamRequest,
        now: Now,
    ) -> Result<DownstreamReceipt, DownstreamError>;

    /// What became of `request`, by its ref.
    ///
    /// # Errors
    ///
    /// [`DownstreamError`] when the downstream cannot be asked; the outcome stays
    /// unknown.
    fn lookup(&mut self, request: &DownstreamRequest) -> Result<Lookup, DownstreamError>;

    /// Whether this is the offline simulation ([`StandIn`]): the only downstream that may
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
        &mut self,
        requests: &[DownstreamRequest],
        now: Now,
    ) -> Vec<Result<DownstreamReceipt, DownstreamError>> {
        requests.iter().map(|request| self.execute(request, now)).collect()
    }
}

/// Whether `downstream` declares an identity it may not: the stand-in's name
/// (`toolledger-stand-in`, at any revision) on anything but the simulation. Every ledger
/// refuses to open with such a downstream, before anything is accepted for it.
///
/// ```
/// use toolledger_contract::DownstreamIdentity;
/// use toolledger_engine::{Downstream, DownstreamError, DownstreamRequest, Lookup, reserved_identity};
/// # use toolledger_store::{DownstreamReceipt, Now};
/// struct Impostor(DownstreamIdentity);
/// impl Downstream for Impostor {
///     fn identity(&self) -> &DownstreamIdentity { &self.0 }
///     fn execute(&mut self, _: &DownstreamRequest, _: Now) -> Result<DownstreamReceipt, DownstreamError> {
///         Err(DownstreamError::NotSent { reason: "never".to_owned() })
///     }
///     fn lookup(&mut self, _: &DownstreamRequest) -> Result<Lookup, DownstreamError> { Ok(Lookup::NotFound) }
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

/// The offline simulation of a refund API, on its own store connection. It only
/// refunds orders: any other tool is refused.
#[derive(Debug)]
pub struct StandIn<S> {
    store: S,
    identity: DownstreamIdentity,
    faults: Faults,
    calls: u64,
}

/// Faults a simulation injects, for drills and the relay's liveness tests: a share of
/// requests not sent, and a delay before each one. Drawn from a digest of the seed, the
/// request ref and the call's number, so a run replays exactly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Percent (0–100) of requests answered "not sent".
    pub unavailable_percent: u8,
    /// Milliseconds each request takes before it is answered.
    pub delay_ms: u64,
    /// The seed of the draw.
    pub seed: u64,
}

impl<S: StandInReceipts> StandIn<S> {
    /// A stand-in committing into `store` (its own connection to the ledger's file).
    pub fn new(store: S) -> StandIn<S> {
        let identity = DownstreamIdentity::new(STAND_IN_NAME, STAND_IN_REVISION)
            .unwrap_or_else(|_| unreachable!("the stand-in's identity is well formed"));
        StandIn { store, identity, faults: Faults::default(), calls: 0 }
    }

    /// The same stand-in, injecting `faults`.
    pub fn with_faults(mut self, faults: Faults) -> StandIn<S> {
        self.faults = faults;
        self
    }

    /// Whether this call is one the faults make "not sent".
    fn unavailable(&mut self, request: &DownstreamRequest) -> bool {
        self.calls += 1;
        if self.faults.delay_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(self.faults.delay_ms));
        }
        if self.faults.unavailable_percent == 0 {
            return false;
        }
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(format!(
            "{}:{}:{}:{}",
            self.faults.seed,
            request.downstream_request_ref,
            std::process::id(),
            self.calls
        ));
        digest.first().is_some_and(|byte| {
            u16::from(*byte) * 100 / 256 < u16::from(self.faults.unavailable_percent)
        })
    }
}

/// A store failure in the stand-in's own commit may have come before or after its
/// commit: the outcome is unknown, never "not sent".
fn unknown(err: StoreError) -> DownstreamError {
    DownstreamError::Unknown { reason: err.to_string() }
}

impl<S: StandInReceipts> Downstream for StandIn<S> {
    fn identity(&self) -> &DownstreamIdentity {
        &self.identity
    }

    fn is_simulation(&self) -> bool {
        true
    }

    fn execute(
        &mut self,
        request: &DownstreamRequest,
        now: Now,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        if request.tool_name != "refund_order" {
            return Err(DownstreamError::Refused {
                reason: "the stand-in only refunds orders".to_owned(),
            });
        }
        if self.unavailable(request) {
            return Err(DownstreamError::NotSent {
                reason: "the simulation was unavailable".to_owned(),
            });
        }
        let receipt = simulated_refund(request);
        let stored = self.store.record_downstream_receipt(&receipt, now).map_err(unknown)?;
        if stored.request_sha256 != request.request_sha256 {
            return Err(DownstreamError::Conflict);
        }
        Ok(stored)
    }

    fn lookup(&mut self, request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        match self.store.downstream_receipt(&request.downstream_request_ref).map_err(unknown)? {
            Some(receipt) => Ok(Lookup::Done(receipt)),
            None => Ok(Lookup::NotFound),
        }
    }

    /// The simulation commits a batch's receipts in one transaction of its own (commit B
    /// of each, together); a failure of that transaction leaves every one unknown.
    fn execute_batch(
        &mut self,
        requests: &[DownstreamRequest],
        now: Now,
    ) -> Vec<Result<DownstreamReceipt, DownstreamError>> {
        let mut answers: Vec<Option<Result<DownstreamReceipt, DownstreamError>>> =
            Vec::with_capacity(requests.len());
        let mut receipts = Vec::new();
        for request in requests {
            if request.tool_name != "refund_order" {
                answers.push(Some(Err(DownstreamError::Refused {
                    reason: "the stand-in only refunds orders".to_owned(),
                })));
            } else if self.unavailable(request) {
                answers.push(Some(Err(DownstreamError::NotSent {
                    reason: "the simulation was unavailable".to_owned(),
                })));
            } else {
                receipts.push(simulated_refund(request));
                answers.push(None);
            }
        }
        let mut stored = match self.store.record_downstream_receipts(&receipts, now) {
            Ok(stored) => stored.into_iter().map(Ok).collect::<Vec<_>>(),
            Err(err) => receipts.iter().map(|_| Err(unknown(err.clone()))).collect(),
        }
        .into_iter();
        requests
            .iter()
            .zip(answers)
            .map(|(request, answer)| match answer {
                Some(answer) => answer,
                None => match stored.next() {
                    Some(Ok(receipt)) if receipt.request_sha256 != request.request_sha256 => {
                        Err(DownstreamError::Conflict)
                    }
                    Some(answer) => answer,
                    None => Err(DownstreamError::Unknown { reason: "no answer".to_owned() }),
                },
            })
            .collect()
    }
}

/// The simulation's refund of `request`: its receipt.
/// The receipt the simulation makes for a refund request: a refund of the order and
/// amount asked for, its `refund_id` derived from the request ref. A pure function of
/// the request, so a lookup can make it again.
///
/// ```
/// use toolledger_engine::{DownstreamRequest, simulated_refund};
/// let request = DownstreamRequest {
///     downstream_request_ref: "dr_0123456789abcdef0123456789abcdef".into(),
///     request_sha256: toolledger_contract::Sha256Hex::new(&"0".repeat(64)).unwrap(),
///     tool_name: "refund_order".into(),
///     output_revision: "refund_order.output.v2".into(),
///     arguments: serde_json::json!({"order_id": "ord-1", "amount_minor": 5, "currency": "USD"}),
/// };
/// let receipt = simulated_refund(&request);
/// assert_eq!(receipt.receipt["output"]["status"], "refunded");
/// assert_eq!(simulated_refund(&request), receipt);
/// ```
pub fn simulated_refund(request: &DownstreamRequest) -> DownstreamReceipt {
    let field = |name: &str| request.arguments.get(name).cloned().unwrap_or(Value::Null);
    request.receipt(json!({
        "refund_id": refund_id(&request.downstream_request_ref),
        "order_id": field("order_id"),
        "amount_minor": field("amount_minor"),
        "currency": field("currency"),
        "status": "refunded",
    }))
}

/// A recovery drill: the [`Downstream`] a command stops "as a crash would", right after
/// a commit, so recovery can be proven. Armed for one call at a time.
pub mod drill {
    use std::sync::{Arc, Mutex, PoisonError};

    use toolledger_contract::DownstreamIdentity;
    use toolledger_store::{DownstreamReceipt, Now};

    use super::{Downstream, DownstreamError, DownstreamRequest, Lookup};

    /// Where the next call stops. (Stopping right after commit A needs no drill: that
    /// is [`Engine::enqueue`](crate::Engine::enqueue).)
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum FailurePoint {
        /// After the claim: the event is processing under a live lease, nothing sent.
        AfterClaim,
        /// After the downstream's commit: the effect happened, no local receipt.
        AfterDownstreamCommit,
    }

    impl FailurePoint {
        /// `after_claim` or `after_downstream_commit`.
        pub fn as_str(self) -> &'static str {
            match self {
                FailurePoint::AfterClaim => "after_claim",
                FailurePoint::AfterDownstreamCommit => "after_downstream_commit",
            }
        }
    }

    /// Arms an [`Interrupt`] for its next execution.
    #[derive(Debug, Clone, Default)]
    pub struct Switch(Arc<Mutex<Option<FailurePoint>>>);

    impl Switch {
        /// The next execution stops at `point`; later ones run normally.
        pub fn arm(&self, point: FailurePoint) {
            *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(point);
        }

        fn take(&self) -> Option<FailurePoint> {
            self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
        }
    }

    /// A downstream that, when armed, answers "unknown" as a process killed at the
    /// point would leave things: after the claim without sending, or after the inner
    /// downstream's commit without its receipt.
    #[derive(Debug)]
    pub struct Interrupt<D> {
        inner: D,
        switch: Switch,
    }

    impl<D: Downstream> Interrupt<D> {
        /// `inner`, interrupted when `switch` is armed.
        pub fn new(inner: D, switch: Switch) -> Interrupt<D> {
            Interrupt { inner, switch }
        }

        /// The switch that arms it.
        pub fn switch(&self) -> &Switch {
            &self.switch
        }
    }

    impl<D: Downstream> Downstream for Interrupt<D> {
        fn identity(&self) -> &DownstreamIdentity {
            self.inner.identity()
        }

        fn identity_for(&self, tool: &str) -> &DownstreamIdentity {
            self.inner.identity_for(tool)
        }

        fn identities(&self) -> Vec<DownstreamIdentity> {
            self.inner.identities()
        }

        fn is_simulation(&self) -> bool {
            self.inner.is_simulation()
        }

        fn execute(
            &mut self,
            request: &DownstreamRequest,
            now: Now,
        ) -> Result<DownstreamReceipt, DownstreamError> {
            let interrupted = || DownstreamError::Unknown { reason: "a recovery drill".to_owned() };
            match self.switch.take() {
                Some(FailurePoint::AfterClaim) => Err(interrupted()),
                Some(FailurePoint::AfterDownstreamCommit) => {
                    self.inner.execute(request, now)?;
                    Err(interrupted())
                }
                None => self.inner.execute(request, now),
            }
        }

        fn lookup(&mut self, request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
            self.inner.lookup(request)
        }

        fn execute_batch(
            &mut self,
            requests: &[DownstreamRequest],
            now: Now,
        ) -> Vec<Result<DownstreamReceipt, DownstreamError>> {
            if self.switch.0.lock().unwrap_or_else(PoisonError::into_inner).is_some() {
                return requests.iter().map(|request| self.execute(request, now)).collect();
            }
            self.inner.execute_batch(requests, now)
        }
    }
}
