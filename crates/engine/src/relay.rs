//! The relay's pass over the outbox: claim a batch of due events in one transaction,
//! then work each exactly as the directed worker would (the same rechecks of contract,
//! current authorization and business state before the downstream is called), with a
//! relay's answer to a request that was not sent: retry after a backoff, dead once the
//! tool's attempts are spent.

use serde_json::Value;
use sha2::{Digest, Sha256};
use toolledger_contract::{BlockCode, Clock, Identifier, PrincipalResolver, StatusRef};
use toolledger_store::{LedgerStore, Now};

use std::sync::Arc;

use toolledger_store::{Claimed, Ending, Finalize, Finalizer, Release};

use crate::{
    Caller, Downstream, Engine, EngineError,
    answers::Answer,
    worker::{Checked, Lease, Recheck, check_receipt, request_of},
};

/// How long a relay waits before sending a request again that was not sent:
/// exponential in the attempt, capped, with jitter so that workers that failed together
/// do not retry together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after the first attempt, in seconds (at least 1).
    pub base_seconds: i64,
    /// The longest wait, in seconds.
    pub max_seconds: i64,
}

impl Default for Backoff {
    /// 2 s, doubling, at most 5 minutes.
    fn default() -> Backoff {
        Backoff { base_seconds: 2, max_seconds: 300 }
    }
}

impl Backoff {
    /// When attempt `attempt` of `status_ref` is due again, from `now`: a delay of
    /// `min(max, base * 2^(attempt-1))`, of which the upper half is jitter. The jitter is
    /// drawn from a digest of the ref and the attempt, so a run can be replayed exactly.
    ///
    /// ```
    /// use toolledger_contract::{StatusRef, UnixSeconds};
    /// let backoff = toolledger_engine::Backoff { base_seconds: 2, max_seconds: 60 };
    /// let status_ref = StatusRef::new(&format!("sr_{}", "0".repeat(32))).unwrap();
    /// let now = UnixSeconds::new(1_767_225_600).unwrap();
    /// let due = backoff.due(&status_ref, 3, now).get() - now.get();
    /// assert!((4..=8).contains(&due), "{due}");
    /// ```
    pub fn due(&self, status_ref: &StatusRef, attempt: i64, now: Now) -> Now {
        let base = self.base_seconds.max(1);
        let max = self.max_seconds.max(base);
        let exponent = u32::try_from((attempt - 1).clamp(0, 30)).unwrap_or(30);
        let delay = base.saturating_mul(1_i64 << exponent).min(max);
        let half = delay / 2;
        let digest = Sha256::digest(format!("{}:{attempt}", status_ref.as_str()));
        let mut draw = [0u8; 8];
        draw.copy_from_slice(digest.get(..8).unwrap_or(&[0; 8]));
        let jitter = i64::try_from(u64::from_be_bytes(draw) % u64::try_from(half + 1).unwrap_or(1))
            .unwrap_or(0);
        let seconds = now.get().saturating_add(delay - half + jitter);
        Now::new(seconds.min(toolledger_contract::UnixSeconds::MAX)).unwrap_or(now)
    }
}

/// What one relay pass did, event by event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drained {
    /// Events claimed.
    pub claimed: usize,
    /// Done: a local receipt.
    pub delivered: usize,
    /// Refused definitively by the downstream.
    pub failed: usize,
    /// Their receipt broke the output contract.
    pub quarantined: usize,
    /// Not sent; pending again after a backoff.
    pub retried: usize,
    /// Not sent, and the tool's attempts are spent.
    pub dead: usize,
    /// The downstream may have acted: each is set aside until a backoff ends, then taken
    /// over and asked about by the same ref.
    pub unknown: usize,
    /// Refused before the downstream (drift, authorization, business state): each is set
    /// aside until a backoff ends, then taken over, asked about and rechecked.
    pub refused: usize,
    /// Another worker took the lease over first: this worker's write was refused.
    pub fenced: usize,
    /// Due events left alone because their row contradicts itself.
    pub skipped: usize,
}

impl Drained {
    /// Adds another pass's counts.
    pub fn add(&mut self, other: &Drained) {
        self.claimed += other.claimed;
        self.delivered += other.delivered;
        self.failed += other.failed;
        self.quarantined += other.quarantined;
        self.retried += other.retried;
        self.dead += other.dead;
        self.unknown += other.unknown;
        self.refused += other.refused;
        self.fenced += other.fenced;
        self.skipped += other.skipped;
    }

    fn count(&mut self, answer: &Answer) {
        let slot = match answer {
            Answer::Pass { .. } => &mut self.delivered,
            Answer::Block { code, package, .. } => match code {
                BlockCode::DownstreamRefused => &mut self.failed,
                BlockCode::ReceiptQuarantined => &mut self.quarantined,
                BlockCode::DownstreamUnavailable if package["status"] == "dead" => &mut self.dead,
                BlockCode::DownstreamUnavailable => &mut self.retried,
                BlockCode::LeaseHeld => &mut self.fenced,
                BlockCode::OutcomeUnknown => &mut self.unknown,
                _ => &mut self.refused,
            },
        };
        *slot += 1;
    }
}

/// Whether a relay's attempt that was answered `code` ended with no outcome recorded and
/// nobody working it: the downstream may have acted (unknown), or a recheck refused the
/// attempt before the downstream (drift, authorization, business state).
fn sets_aside(code: BlockCode) -> bool {
    !matches!(
        code,
        BlockCode::DownstreamRefused
            | BlockCode::ReceiptQuarantined
            | BlockCode::DownstreamUnavailable
            | BlockCode::LeaseHeld
    )
}

impl<S: LedgerStore, D: Downstream, R: PrincipalResolver> Engine<S, D, R> {
    /// Counts how a relay's attempt ended, and sets aside one that ended with no outcome
    /// recorded ([`Release::Later`]): its lease ends after a backoff instead of being
    /// renewed while this relay lives, and then a relay takes it over and asks the
    /// downstream (or rechecks) again. An attempt that ended in a failure of the store or
    /// the resolver is set aside too, when the store still answers; fenced by owner and
    /// attempt, so an operation that meanwhile ended or was taken over is not touched.
    fn ended(
        &mut self,
        status_ref: &StatusRef,
        lease: &Lease<'_>,
        clock: &Clock,
        worked: Result<Answer, EngineError>,
        drained: &mut Drained,
    ) {
        let Caller::Relay(backoff) = lease.caller else { return };
        let reason = match &worked {
            Ok(answer) => {
                drained.count(answer);
                match answer {
                    Answer::Block { code, .. } if sets_aside(*code) => code.message(),
                    _ => return,
                }
            }
            Err(_) => {
                drained.unknown += 1;
                "the relay could not finish this attempt"
            }
        };
        let at = backoff.due(status_ref, lease.attempt, clock.now);
        let later = Release::Later { at, reason };
        // Best effort: when it cannot be written, the lease still ends within one lease,
        // as this pass's owner is renewed no more once the pass returns.
        let _ = self.store.release(status_ref, &lease.fenced(), &later, clock.now);
    }

    /// One relay pass: claims up to `limit` due events for `owner` (one transaction) and
    /// works each. Only the events of this relay's downstream are claimed: another
    /// downstream's operations are left for its own relay.
    ///
    /// # Errors
    ///
    /// [`EngineError`] when the batch claim fails (nothing was claimed). A failure
    /// working one claimed event is counted `unknown`: the event stays under its lease.
    pub fn relay_batch(
        &mut self,
        owner: &Identifier,
        clock: &Clock,
        context: &Value,
        limit: usize,
        backoff: Backoff,
    ) -> Result<Drained, EngineError> {
        // A downstream that routes tools to several services: one claim per identity, so
        // no event is ever sent to a service it was not accepted for.
        let mut drained = Drained::default();
        for identity in self.downstream.identities() {
            let each = self.relay_batch_of(&identity, owner, clock, context, limit, backoff)?;
            drained.add(&each);
        }
        Ok(drained)
    }

    fn relay_batch_of(
        &mut self,
        identity: &toolledger_contract::DownstreamIdentity,
        owner: &Identifier,
        clock: &Clock,
        context: &Value,
        limit: usize,
        backoff: Backoff,
    ) -> Result<Drained, EngineError> {
        let batch = self.store.claim_due(owner, identity, clock.now, clock.lease_seconds, limit)?;
        let mut drained = Drained { skipped: batch.skipped, ..Drained::default() };
        // Each event is rechecked on its own; those that may be sent go to the downstream
        // together, and those it answered with a receipt end in one commit C.
        let mut ready = Vec::new();
        for Claimed { attempt, reclaimed, operation } in batch.claimed {
            drained.claimed += 1;
            let status_ref = operation.intent.status_ref.clone();
            let lease = Lease { owner, attempt, caller: Caller::Relay(backoff), reclaimed };
            if reclaimed {
                // A lease taken over: asked about first, one by one (see `work_claimed`).
                let worked = self.work_claimed(&status_ref, &operation, &lease, clock, context);
                self.ended(&status_ref, &lease, clock, worked, &mut drained);
                continue;
            }
            match self.recheck(&operation, context, clock.now) {
                Ok(Recheck::Send) => ready.push((attempt, operation)),
                Ok(Recheck::Refused(refused)) => {
                    self.ended(&status_ref, &lease, clock, Ok(refused), &mut drained)
                }
                Ok(Recheck::Unsent(unsent)) => {
                    let unsent = Err(unsent);
                    let worked =
                        self.conclude(&status_ref, &operation, &lease, unsent, clock, context);
                    self.ended(&status_ref, &lease, clock, worked, &mut drained);
                }
                Err(err) => self.ended(&status_ref, &lease, clock, Err(err), &mut drained),
            }
        }
        let requests: Vec<_> = ready.iter().map(|(_, operation)| request_of(operation)).collect();
        let answers = self.downstream.execute_batch(&requests, clock.now);
        let registry = Arc::clone(&self.registry);
        let mut receipts = Vec::new();
        for ((attempt, operation), answer) in ready.into_iter().zip(answers) {
            let status_ref = operation.intent.status_ref.clone();
            let lease = Lease { owner, attempt, caller: Caller::Relay(backoff), reclaimed: false };
            let finalizer = Finalizer::Lease(lease.fenced());
            let tool = registry.tool(&operation.intent.scope.tool_name);
            match (answer, tool) {
                (Ok(receipt), Some(tool)) => match check_receipt(&operation, tool, receipt.clone())
                {
                    Ok(Checked::Valid(local)) if self.downstream.can_look_up(&tool.name) => {
                        receipts.push((status_ref, finalizer, local));
                    }
                    Ok(Checked::Valid(local)) => {
                        // No lookup could recover it: its own synced commit C.
                        let synced = Ending::SucceededSynced(&local);
                        let ended = self.store.end(&status_ref, &finalizer, &synced, clock.now);
                        match ended {
                            Ok(Finalize::LeaseLost) => drained.fenced += 1,
                            Ok(Finalize::Finalized | Finalize::AlreadyFinal) => {
                                drained.delivered += 1;
                            }
                            Err(_) => drained.unknown += 1,
                        }
                    }
                    Ok(Checked::Broken(reason)) => {
                        let broken = Ending::Quarantined { receipt: &receipt.receipt_json, reason };
                        let ended = self.store.end(&status_ref, &finalizer, &broken, clock.now);
                        let worked = ended.map_err(EngineError::from).and_then(|ending| {
                            self.after_ending(ending, &status_ref, lease.caller, context)
                        });
                        self.ended(&status_ref, &lease, clock, worked, &mut drained);
                    }
                    Err(err) => self.ended(&status_ref, &lease, clock, Err(err), &mut drained),
                },
                (answer, _) => {
                    // Not sent, refused, unknown: as the single worker answers them.
                    let worked =
                        self.conclude(&status_ref, &operation, &lease, answer, clock, context);
                    self.ended(&status_ref, &lease, clock, worked, &mut drained);
                }
            }
        }
        // A failed commit C leaves its operations under leases no heartbeat renews once
        // this pass returns (the relay's owner is the pass's own): they end within one
        // lease, and are then taken over and asked about.
        match self.store.finalize_many(&receipts, clock.now) {
            Ok(ended) => {
                for ending in ended {
                    match ending {
                        Finalize::Finalized => drained.delivered += 1,
                        Finalize::LeaseLost => drained.fenced += 1,
                        Finalize::AlreadyFinal => drained.delivered += 1,
                    }
                }
            }
            // Nothing of the batch's commit C was written: each stays processing under its
            // lease, to be taken over and asked about.
            Err(_) => drained.unknown += receipts.len(),
        }
        Ok(drained)
    }
}
