//! The behaviour of a tool: who may call it on what, whether the business allows it
//! now, and whether it needs an approval.
//!
//! A tool is data plus behaviour. Its data — name, six revisions, input and output
//! schemas — is a [`ToolSpec`](crate::ToolSpec); its behaviour is a [`ToolRules`] the
//! host implements and registers with it. `refund_order` is one implementation
//! ([`RefundOrder`](crate::RefundOrder)); a host's ticket or payment tool is another.

use std::fmt;

use serde_json::Value;

use crate::Identifier;

/// What a rule is asked about.
#[derive(Debug, Clone, Copy)]
pub struct RuleCall<'a> {
    /// The principal's tenant.
    pub tenant_id: &'a Identifier,
    /// The principal.
    pub subject_id: &'a Identifier,
    /// The roles the principal holds *now* (asked of the resolver for this check; never
    /// stored).
    pub roles: &'a [String],
    /// The call's arguments, already valid against the tool's input schema.
    pub arguments: &'a Value,
    /// The host's business context for this call (the case file's `business_state`;
    /// `null` when the rules consult the host's own systems instead).
    pub context: &'a Value,
}

/// Whether a new intent needs an approval before it is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalPolicy {
    /// An approval bound to this exact call must be presented and valid.
    Required,
    /// No approval is needed (one presented anyway is ignored and not stored).
    NotRequired,
}

/// The principal may not act on the resource, or it does not exist: deliberately one
/// answer (`NOT_FOUND` at dispatch, replay and status; `AUTHORIZATION_DENIED` in the
/// worker), so a caller cannot probe for resources that are not theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denied;

/// The business state does not allow the effect now (`BUSINESS_STATE_INVALID`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusinessRefusal;

/// What a business precondition answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The effect is allowed now.
    Allow,
    /// The business does not allow it (`BUSINESS_STATE_INVALID`), with the reason the
    /// one who judged it gave, if any.
    Refuse {
        /// Why, as the judge said it.
        reason: Option<String>,
    },
    /// The judge could not be asked (a lookup that did not answer): nothing is decided.
    /// At acceptance nothing is written (`DOWNSTREAM_UNAVAILABLE`); before the effect
    /// the request is not sent, and is tried again later.
    Unavailable {
        /// What went wrong, naming the kind of failure only.
        reason: String,
    },
}

/// A business precondition asked of a system outside the ledger (an HTTP lookup on the
/// tool's downstream): what a definition's `precondition` is answered by.
pub trait Precondition: fmt::Debug + Send + Sync {
    /// Whether the effect `call` asks for is allowed now.
    fn ask(&self, call: &RuleCall<'_>) -> Verdict;
}

/// A tool's rules. Every method is pure over what it is handed (and whatever the
/// implementation reads of the host's own systems): the ledger calls them at
/// acceptance, again in the worker right before the side effect, and on every replay
/// and status query, with the *current* roles each time.
///
/// # Example
///
/// ```
/// use toolledger_contract::{ApprovalPolicy, BusinessRefusal, Denied, RuleCall, ToolRules};
/// use serde_json::Value;
///
/// /// Anyone may open a ticket in their own tenant's queue; no approval.
/// #[derive(Debug)]
/// struct OpenTicket;
///
/// impl ToolRules for OpenTicket {
///     fn authorize(&self, call: &RuleCall<'_>) -> Result<(), Denied> {
///         let queue = call.arguments.get("queue").and_then(Value::as_str);
///         if queue.is_some_and(|queue| queue.starts_with(call.tenant_id.as_str())) {
///             Ok(())
///         } else {
///             Err(Denied)
///         }
///     }
///
///     fn check_business(&self, _call: &RuleCall<'_>) -> Result<(), BusinessRefusal> {
///         Ok(())
///     }
///
///     fn approval(&self, _arguments: &Value) -> ApprovalPolicy {
///         ApprovalPolicy::NotRequired
///     }
/// }
/// # let _ = OpenTicket;
/// ```
pub trait ToolRules: fmt::Debug + Send + Sync {
    /// Which resource the call touches and whether this principal, with these roles,
    /// may act on it. A missing resource and someone else's are both [`Denied`].
    ///
    /// # Errors
    ///
    /// [`Denied`].
    fn authorize(&self, call: &RuleCall<'_>) -> Result<(), Denied>;

    /// The business precondition: whether the effect is allowed now.
    ///
    /// # Errors
    ///
    /// [`BusinessRefusal`].
    fn check_business(&self, call: &RuleCall<'_>) -> Result<(), BusinessRefusal>;

    /// The business precondition with its reason and a third answer, *not decided*: what
    /// the ledger asks. The default is [`ToolRules::check_business`]'s answer.
    fn precondition(&self, call: &RuleCall<'_>) -> Verdict {
        match self.check_business(call) {
            Ok(()) => Verdict::Allow,
            Err(BusinessRefusal) => Verdict::Refuse { reason: None },
        }
    }

    /// Whether these arguments need an approval (a threshold is a policy that looks at
    /// an argument).
    fn approval(&self, arguments: &Value) -> ApprovalPolicy;

    /// Checks a business context before any call uses it (the case-file loader refuses
    /// a context this returns an error for, with the message as its reason). The
    /// default accepts any JSON object.
    ///
    /// # Errors
    ///
    /// What is wrong, naming members only, never values.
    fn check_context(&self, context: &Value) -> Result<(), String> {
        if context.is_object() {
            Ok(())
        } else {
            Err("business_state must be an object".to_owned())
        }
    }
}
