//! What a call is answered: a typed outcome, and the canonical package it renders to.

use serde_json::Value;
use toolledger_contract::{BlockCode, Delivery, StatusRef};
use toolledger_engine::Answer;
use toolledger_json::canonicalize;

/// A receipt of a done operation, as the PASS package carries it.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("receipt");
/// if let toolledger::Outcome::Fresh(receipt) = ledger.dispatch(&call)?.outcome() {
///     println!("{} for {}", receipt.output(), receipt.status_ref());
/// }
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Receipt {
    status_ref: StatusRef,
    output: Value,
    result_sha256: String,
    request_sha256: String,
    receipt_ref: String,
}

impl Receipt {
    /// The operation's status ref.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("receipt-ref");
    /// if let toolledger::Outcome::Fresh(receipt) = ledger.dispatch(&call)?.outcome() {
    ///     assert!(receipt.status_ref().as_str().starts_with("sr_"));
    /// }
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn status_ref(&self) -> &StatusRef {
        &self.status_ref
    }

    /// The tool's output (the model's view), checked against the output contract.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("receipt-output");
    /// if let toolledger::Outcome::Fresh(receipt) = ledger.dispatch(&call)?.outcome() {
    ///     assert_eq!(receipt.output()["status"], "refunded");
    /// }
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn output(&self) -> &Value {
        &self.output
    }

    /// `result_sha256`: the digest binding the output to the tool and its revision.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("receipt-result");
    /// if let toolledger::Outcome::Fresh(receipt) = ledger.dispatch(&call)?.outcome() {
    ///     assert_eq!(receipt.result_sha256().len(), 64);
    /// }
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn result_sha256(&self) -> &str {
        &self.result_sha256
    }

    /// `request_sha256`: the digest of the exact request it answers.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("receipt-request");
    /// if let toolledger::Outcome::Fresh(receipt) = ledger.dispatch(&call)?.outcome() {
    ///     assert_eq!(receipt.request_sha256().len(), 64);
    /// }
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn request_sha256(&self) -> &str {
        &self.request_sha256
    }

    /// `rc_…`: the downstream receipt it rests on.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("receipt-rc");
    /// if let toolledger::Outcome::Fresh(receipt) = ledger.dispatch(&call)?.outcome() {
    ///     assert!(receipt.receipt_ref().starts_with("rc_"));
    /// }
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn receipt_ref(&self) -> &str {
        &self.receipt_ref
    }

    fn of(package: &Value) -> Option<Receipt> {
        let text = |pointer: &str| package.pointer(pointer).and_then(Value::as_str);
        Some(Receipt {
            status_ref: StatusRef::new(text("/status_ref")?).ok()?,
            output: package.pointer("/result/model_view")?.clone(),
            result_sha256: text("/result/digests/result_sha256")?.to_owned(),
            request_sha256: text("/result/digests/request_sha256")?.to_owned(),
            receipt_ref: text("/result/host_view/downstream_receipt_ref")?.to_owned(),
        })
    }
}

/// How a call ended, typed.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("outcome");
/// match ledger.dispatch(&call)?.outcome() {
///     toolledger::Outcome::Fresh(receipt) | toolledger::Outcome::Replayed(receipt)
///     | toolledger::Outcome::Reconciled(receipt) => println!("done: {}", receipt.output()),
///     toolledger::Outcome::Unknown { status_ref } => println!("query {status_ref} later"),
///     toolledger::Outcome::Accepted { status_ref } => println!("queued as {status_ref}"),
///     toolledger::Outcome::Blocked { code, .. } => println!("blocked: {code}"),
/// }
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Done now, by this call.
    Fresh(Receipt),
    /// Done before: the ledger's receipt, answered again without a second effect.
    Replayed(Receipt),
    /// Done, as a status query just learned from the downstream.
    Reconciled(Receipt),
    /// It may or may not have happened: query `status_ref`, never retry under a new key.
    Unknown {
        /// The operation to query.
        status_ref: StatusRef,
    },
    /// Accepted and queued ([`Ledger::enqueue`](crate::Ledger::enqueue)); nothing was sent
    /// yet: a worker or the relay performs it, and `status_ref` names it.
    Accepted {
        /// The operation.
        status_ref: StatusRef,
    },
    /// Refused, or ended without success: the code says why.
    Blocked {
        /// Why.
        code: BlockCode,
        /// The operation, where the caller may see it.
        status_ref: Option<StatusRef>,
    },
}

impl Outcome {
    /// Whether the effect is done (fresh, replayed or reconciled).
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("is-done");
    /// assert!(ledger.dispatch(&call)?.outcome().is_done());
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn is_done(&self) -> bool {
        matches!(self, Outcome::Fresh(_) | Outcome::Replayed(_) | Outcome::Reconciled(_))
    }
}

/// The answer to one call: its [`Outcome`] and the canonical package (the Tool Result
/// v2 PASS package, or a BLOCK package) a host hands to the model or logs.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("reply");
/// let reply = ledger.dispatch(&call)?;
/// assert_eq!(reply.package()["code"], "OK");
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    outcome: Outcome,
    package: Value,
    ended: Option<String>,
}

impl Reply {
    /// `NOT_FOUND` with no operation shown: what a status ref that is not even well
    /// formed is answered, exactly as one that names nothing.
    ///
    /// ```
    /// let reply = toolledger::Reply::not_found();
    /// assert_eq!(reply.package()["code"], "NOT_FOUND");
    /// ```
    pub fn not_found() -> Reply {
        Reply::from(Answer::not_found())
    }

    /// What a host that crashed right after commit A must assume of this `ACCEPTED`
    /// reply, which it never saw: `OUTCOME_UNKNOWN`, with the same status and ref (the
    /// recovery drills answer this). Any other reply is returned as it is.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("as-if-lost");
    /// let lost = ledger.enqueue(&call)?.as_if_lost();
    /// assert!(matches!(lost.outcome(), toolledger::Outcome::Unknown { .. }));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    #[must_use]
    pub fn as_if_lost(self) -> Reply {
        match self.outcome {
            Outcome::Accepted { .. } => {
                let Reply { package, ended, .. } = self;
                Reply::from(
                    Answer::Block { code: BlockCode::Accepted, package, ended }.as_if_lost(),
                )
            }
            _ => self,
        }
    }

    /// What the ledger decided, in the words of the call span's `toolledger.decision`
    /// (`docs/observability.md`): `fresh`, `replay`, `reconciled`, `accepted`,
    /// `outcome_unknown`, `conflict`, `approval_required`, or `blocked` for any other
    /// refusal. A host that traces the call in its own span sets it there.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("reply-decision");
    /// assert_eq!(ledger.dispatch(&call)?.decision(), "fresh");
    /// assert_eq!(ledger.dispatch(&call)?.decision(), "replay");
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn decision(&self) -> &'static str {
        match &self.outcome {
            Outcome::Fresh(_) => "fresh",
            Outcome::Replayed(_) => "replay",
            Outcome::Reconciled(_) => "reconciled",
            Outcome::Accepted { .. } => "accepted",
            Outcome::Unknown { .. } => "outcome_unknown",
            Outcome::Blocked { code, .. } => match code {
                BlockCode::IdempotencyConflict => "conflict",
                BlockCode::ApprovalRequired => "approval_required",
                BlockCode::OutcomeUnknown => "outcome_unknown",
                _ => "blocked",
            },
        }
    }

    /// The call span's `error.type`: the code when the call did not end as asked (a
    /// refusal's code, `OUTCOME_UNKNOWN`); `None` when it did (done, or accepted).
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("reply-error-type");
    /// assert_eq!(ledger.dispatch(&call)?.error_type(), None);
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn error_type(&self) -> Option<&'static str> {
        match &self.outcome {
            Outcome::Fresh(_) | Outcome::Replayed(_) | Outcome::Reconciled(_) => None,
            Outcome::Accepted { .. } => None,
            Outcome::Unknown { .. } => Some(BlockCode::OutcomeUnknown.as_str()),
            Outcome::Blocked { code, .. } => Some(code.as_str()),
        }
    }

    /// The typed outcome.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("reply-outcome");
    /// let reply = ledger.dispatch(&call)?;
    /// assert!(matches!(reply.outcome(), toolledger::Outcome::Fresh(_)));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }

    /// For an operation that ended without success, why, as the ledger recorded it: the
    /// downstream's refusal ("card declined"), or a quarantine's reason. The package
    /// carries fixed sentences only, so a frontend that shows the reason reads it here,
    /// never from the ledger again.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("reply-ended");
    /// let reply = ledger.dispatch(&call)?;
    /// assert_eq!(reply.ended_reason(), None);
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn ended_reason(&self) -> Option<&str> {
        self.ended.as_deref()
    }

    /// The package, as a JSON value.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("reply-package");
    /// assert_eq!(ledger.dispatch(&call)?.package()["gate"], "PASS");
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn package(&self) -> &Value {
        &self.package
    }

    /// The package in canonical form (RFC 8785): byte for byte what the command line
    /// prints.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("reply-canonical");
    /// assert!(ledger.dispatch(&call)?.canonical().starts_with("{\"code\":\"OK\""));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn canonical(&self) -> String {
        canonicalize(&self.package)
    }

    /// The operation's status ref, when the package shows one.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("reply-ref");
    /// assert!(ledger.enqueue(&call)?.status_ref().is_some());
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn status_ref(&self) -> Option<&StatusRef> {
        match &self.outcome {
            Outcome::Fresh(receipt) | Outcome::Replayed(receipt) | Outcome::Reconciled(receipt) => {
                Some(receipt.status_ref())
            }
            Outcome::Unknown { status_ref } | Outcome::Accepted { status_ref } => Some(status_ref),
            Outcome::Blocked { status_ref, .. } => status_ref.as_ref(),
        }
    }
}

impl From<Answer> for Reply {
    fn from(answer: Answer) -> Reply {
        let status_ref = answer
            .package()
            .get("status_ref")
            .and_then(Value::as_str)
            .and_then(|text| StatusRef::new(text).ok());
        let outcome = match &answer {
            Answer::Pass { delivery, package } => match (Receipt::of(package), delivery) {
                (Some(receipt), Delivery::Fresh) => Outcome::Fresh(receipt),
                (Some(receipt), Delivery::LocalReplay) => Outcome::Replayed(receipt),
                (Some(receipt), Delivery::ReceiptReconciled) => Outcome::Reconciled(receipt),
                // The engine builds every PASS package with all of these members.
                (None, _) => unreachable!("a PASS package without its receipt members"),
            },
            Answer::Block { code: BlockCode::OutcomeUnknown, .. } => match status_ref {
                Some(status_ref) => Outcome::Unknown { status_ref },
                None => Outcome::Blocked { code: BlockCode::OutcomeUnknown, status_ref: None },
            },
            Answer::Block { code: BlockCode::Accepted, .. } => match status_ref {
                Some(status_ref) => Outcome::Accepted { status_ref },
                None => Outcome::Blocked { code: BlockCode::Accepted, status_ref: None },
            },
            Answer::Block { code, .. } => Outcome::Blocked { code: *code, status_ref },
        };
        let (package, ended) = match answer {
            Answer::Pass { package, .. } => (package, None),
            Answer::Block { package, ended, .. } => (package, ended),
        };
        Reply { outcome, package, ended }
    }
}
