//! The stand-in downstream. The seam itself ([`Downstream`], [`DownstreamRequest`],
//! [`DownstreamError`], [`Lookup`]) is `toolledger-downstream`'s, re-exported here.
//!
//! [`StandIn`] is the offline simulation the command line uses: it commits its receipt
//! in its own transaction (commit B) in the store's `downstream_receipts` table,
//! returns the first receipt for a repeated ref, and refuses a different request under
//! the same ref.

use std::sync::{
    Mutex,
    atomic::{AtomicU64, Ordering},
};

use serde_json::{Value, json};
use toolledger_contract::{DownstreamIdentity, DownstreamRequestRef, digest::refund_id};
pub use toolledger_downstream::{
    AsyncDownstream, Downstream, DownstreamError, DownstreamRequest, Lookup, reserved_identity,
};
use toolledger_store::{
    DownstreamReceipt, Now, STAND_IN_NAME, STAND_IN_REVISION, StoreError, driver::Backend, ledger,
};

/// The stand-in downstream's own storage: its receipts table, in the same database as
/// the ledger but written only by the stand-in's own transaction (commit B). A real
/// downstream keeps its receipts on its own side; the ledger's flows never write here.
///
/// It is not part of the ledger's store boundary: every
/// [`Backend`](toolledger_store::driver::Backend) has it, through the store's commit B
/// ([`RecordReceipts`](toolledger_store::ledger::RecordReceipts)) and, for a batch, the
/// backend's own [`batch_record_receipts`](toolledger_store::driver::Backend::batch_record_receipts).
pub trait StandInReceipts {
    /// Commit B: the downstream stand-in stores `receipt` unless one exists for its
    /// `downstream_request_ref`; returns the stored one either way.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn record_downstream_receipt(
        &mut self,
        receipt: &DownstreamReceipt,
        now: Now,
    ) -> Result<DownstreamReceipt, StoreError>;

    /// The downstream receipt for `downstream_request_ref`, verified against itself.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn downstream_receipt(
        &mut self,
        downstream_request_ref: &DownstreamRequestRef,
    ) -> Result<Option<DownstreamReceipt>, StoreError>;

    /// Commit B of several receipts in one transaction (the simulation's batch), each as
    /// [`record_downstream_receipt`](StandInReceipts::record_downstream_receipt) would.
    ///
    /// # Errors
    ///
    /// [`StoreError`]; a failure rolls the whole batch back.
    fn record_downstream_receipts(
        &mut self,
        receipts: &[DownstreamReceipt],
        now: Now,
    ) -> Result<Vec<DownstreamReceipt>, StoreError>;
}

/// The stand-in's receipts, on any backend.
impl<B: Backend> StandInReceipts for B {
    fn record_downstream_receipt(
        &mut self,
        receipt: &DownstreamReceipt,
        now: Now,
    ) -> Result<DownstreamReceipt, StoreError> {
        let (stored, command) =
            self.commit(ledger::RecordReceipts::new(std::slice::from_ref(receipt), now))?;
        command.answer(stored).pop().ok_or(StoreError::Internal("the receipt vanished"))
    }

    fn downstream_receipt(
        &mut self,
        downstream_request_ref: &DownstreamRequestRef,
    ) -> Result<Option<DownstreamReceipt>, StoreError> {
        self.read(|db| ledger::downstream_receipt(db, downstream_request_ref))
    }

    fn record_downstream_receipts(
        &mut self,
        receipts: &[DownstreamReceipt],
        now: Now,
    ) -> Result<Vec<DownstreamReceipt>, StoreError> {
        self.batch_record_receipts(receipts, now)
    }
}

/// The offline simulation of a refund API, on its own store connection. It only
/// refunds orders: any other tool is refused. Callers sharing it take turns on its
/// connection for its commit B only; a fault's delay is waited outside it.
#[derive(Debug)]
pub struct StandIn<S> {
    store: Mutex<S>,
    identity: DownstreamIdentity,
    faults: Faults,
    calls: AtomicU64,
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
        StandIn {
            store: Mutex::new(store),
            identity,
            faults: Faults::default(),
            calls: AtomicU64::new(0),
        }
    }

    /// The same stand-in, injecting `faults`.
    pub fn with_faults(mut self, faults: Faults) -> StandIn<S> {
        self.faults = faults;
        self
    }

    /// Its connection, for one commit or read.
    fn store(&self) -> std::sync::MutexGuard<'_, S> {
        self.store.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether this call is one the faults make "not sent".
    fn unavailable(&self, request: &DownstreamRequest) -> bool {
        let call = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
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
            call
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
        &self,
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
        let stored = self.store().record_downstream_receipt(&receipt, now).map_err(unknown)?;
        if stored.request_sha256 != request.request_sha256 {
            return Err(DownstreamError::Conflict);
        }
        Ok(stored)
    }

    fn lookup(&self, request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        match self.store().downstream_receipt(&request.downstream_request_ref).map_err(unknown)? {
            Some(receipt) => Ok(Lookup::Done(receipt)),
            None => Ok(Lookup::NotFound),
        }
    }

    /// The simulation commits a batch's receipts in one transaction of its own (commit B
    /// of each, together); a failure of that transaction leaves every one unknown.
    fn execute_batch(
        &self,
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
        let mut stored = match self.store().record_downstream_receipts(&receipts, now) {
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
///     downstream_request_ref: toolledger_contract::DownstreamRequestRef::new("dr_0123456789abcdef0123456789abcdef").unwrap(),
///     request_sha256: toolledger_contract::Sha256Hex::new(&"0".repeat(64)).unwrap(),
///     tool_name: "refund_order".into(),
///     output_revision: "refund_order.output.v2".into(),
///     arguments: serde_json::json!({"order_id": "ord-1", "amount_minor": 5, "currency": "USD"}),
/// };
/// let receipt = simulated_refund(&request);
/// assert_eq!(receipt.receipt()["output"]["status"], "refunded");
/// assert_eq!(simulated_refund(&request), receipt);
/// ```
pub fn simulated_refund(request: &DownstreamRequest) -> DownstreamReceipt {
    let field = |name: &str| request.arguments.get(name).cloned().unwrap_or(Value::Null);
    request.receipt(json!({
        "refund_id": refund_id(request.downstream_request_ref.as_str()),
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
            &self,
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

        fn lookup(&self, request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
            self.inner.lookup(request)
        }

        fn can_look_up(&self, tool: &str) -> bool {
            self.inner.can_look_up(tool)
        }

        fn execute_batch(
            &self,
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
