//! The downstream: where the side effect happens.
//!
//! [`Downstream`] is what a real payment API would implement: execute a request
//! idempotently on its `downstream_request_ref`, and answer a status lookup. [`StandIn`]
//! is the offline stand-in: it commits its receipt in its own transaction (commit B) in
//! the store's `downstream_receipts` table, returns the first receipt for a repeated
//! ref, and refuses a different request under the same ref.

use serde_json::{Value, json};
use toolledger_contract::{
    Sha256Hex,
    digest::{downstream_receipt, downstream_receipt_ref, refund_id},
};
use toolledger_store::{DownstreamReceipt, LedgerStore, Now, StoreError};

/// What the worker asks the downstream to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownstreamRequest {
    /// The scope the downstream is idempotent on.
    pub downstream_request_ref: String,
    /// The request digest.
    pub request_sha256: Sha256Hex,
    /// The tool.
    pub tool_name: String,
    /// The output revision the receipt must carry.
    pub output_revision: String,
    /// The arguments, from the ledger.
    pub arguments: Value,
}

/// A system that performs side effects, idempotently per `downstream_request_ref`.
pub trait Downstream {
    /// Performs `request` (or, if this ref was seen, returns the first receipt).
    ///
    /// # Errors
    ///
    /// When the downstream fails or refuses; the caller keeps the outcome unknown.
    fn execute(
        &mut self,
        request: &DownstreamRequest,
        now: Now,
    ) -> Result<DownstreamReceipt, StoreError>;

    /// The receipt for `downstream_request_ref`, if the side effect happened.
    ///
    /// # Errors
    ///
    /// When the downstream cannot be asked.
    fn lookup(
        &mut self,
        downstream_request_ref: &str,
    ) -> Result<Option<DownstreamReceipt>, StoreError>;
}

/// The offline stand-in for a refund API, on its own store connection.
#[derive(Debug)]
pub struct StandIn<S> {
    store: S,
}

impl<S: LedgerStore> StandIn<S> {
    /// A stand-in committing into `store` (its own connection to the ledger's file).
    pub fn new(store: S) -> StandIn<S> {
        StandIn { store }
    }
}

impl<S: LedgerStore> Downstream for StandIn<S> {
    fn execute(
        &mut self,
        request: &DownstreamRequest,
        now: Now,
    ) -> Result<DownstreamReceipt, StoreError> {
        if request.tool_name != "refund_order" {
            return Err(StoreError::ContractViolation("the stand-in only refunds orders"));
        }
        let field = |name: &str| request.arguments.get(name).cloned().unwrap_or(Value::Null);
        let output = json!({
            "refund_id": refund_id(&request.downstream_request_ref),
            "order_id": field("order_id"),
            "amount_minor": field("amount_minor"),
            "currency": field("currency"),
            "status": "refunded",
        });
        let receipt = downstream_receipt(
            &request.downstream_request_ref,
            &request.request_sha256,
            &request.tool_name,
            &request.output_revision,
            &output,
        );
        let receipt_ref = downstream_receipt_ref(&receipt);
        let stored = self.store.record_downstream_receipt(
            &DownstreamReceipt {
                downstream_request_ref: request.downstream_request_ref.clone(),
                request_sha256: request.request_sha256.clone(),
                receipt,
                receipt_ref,
            },
            now,
        )?;
        if stored.request_sha256 != request.request_sha256 {
            return Err(StoreError::ContractViolation(
                "the downstream holds a different request under this ref",
            ));
        }
        Ok(stored)
    }

    fn lookup(
        &mut self,
        downstream_request_ref: &str,
    ) -> Result<Option<DownstreamReceipt>, StoreError> {
        self.store.downstream_receipt(downstream_request_ref)
    }
}
