//! Authorization and business rules (SPEC §4.4): pure functions over the current roles
//! and the business state.
//!
//! Roles are never stored and never read from the case: a [`PrincipalResolver`] answers
//! with the *current* roles each time it is asked. A resource the principal may not see
//! looks exactly like a missing one.

use serde_json::Value;

use crate::{ContractError, Identifier, ToolSpec};

/// The role that lets a subject act on another subject's orders in the same tenant.
pub const SUPPORT_ADMIN: &str = "support_admin";

/// Answers with the current roles of a principal.
///
/// Called before reservation, again just before the reservation transaction, in the
/// worker before the side effect, and on every replay and status query. An
/// implementation must not cache across calls: revocation has to be seen.
pub trait PrincipalResolver {
    /// The roles `(tenant_id, subject_id)` holds now. Unknown roles are ignored by the
    /// rules, so an implementation may return whatever its source holds.
    ///
    /// # Errors
    ///
    /// When the source of roles cannot be read or is invalid (`CLAIMS_IO_ERROR`,
    /// `CLAIMS_INVALID`): the caller fails closed.
    fn current_roles(
        &self,
        tenant_id: &Identifier,
        subject_id: &Identifier,
    ) -> Result<Vec<String>, ContractError>;
}

/// The default resolver: nobody holds any role, so subjects act only on what they own.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoRoles;

impl PrincipalResolver for NoRoles {
    fn current_roles(&self, _: &Identifier, _: &Identifier) -> Result<Vec<String>, ContractError> {
        Ok(Vec::new())
    }
}

/// One order of the business state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    /// The order's id (the input schema's `order_id` pattern).
    pub order_id: String,
    /// The tenant it belongs to.
    pub tenant_id: Identifier,
    /// The subject who owns it.
    pub owner_subject_id: Identifier,
    /// e.g. `paid`.
    pub status: String,
    /// What was paid, in minor units.
    pub amount_minor: i64,
    /// ISO 4217 code.
    pub currency: String,
}

/// The business state a case carries: its orders, unique by id.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BusinessState {
    /// The orders.
    pub orders: Vec<Order>,
}

impl BusinessState {
    /// The order with this id.
    pub fn order(&self, order_id: &str) -> Option<&Order> {
        self.orders.iter().find(|order| order.order_id == order_id)
    }
}

/// The principal may not see the resource, or it does not exist: deliberately one
/// answer (`NOT_FOUND` at dispatch, replay and status; `AUTHORIZATION_DENIED` in the
/// worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denied;

/// Authorizes `(tenant_id, subject_id)` holding `roles` to call `tool` with
/// `arguments`: the resource named by the tool's resource argument must exist in the
/// principal's tenant and be the subject's own, or the subject must hold
/// [`SUPPORT_ADMIN`].
///
/// # Errors
///
/// [`Denied`] for a missing resource and for someone else's alike.
pub fn authorize<'s>(
    tool: &ToolSpec,
    arguments: &Value,
    tenant_id: &Identifier,
    subject_id: &Identifier,
    roles: &[String],
    state: &'s BusinessState,
) -> Result<&'s Order, Denied> {
    let order_id = arguments.get(tool.resource_argument).and_then(Value::as_str).ok_or(Denied)?;
    let order = state.order(order_id).ok_or(Denied)?;
    let in_tenant = order.tenant_id == *tenant_id;
    let owns = order.owner_subject_id == *subject_id;
    let admin = roles.iter().any(|role| role == SUPPORT_ADMIN);
    if in_tenant && (owns || admin) { Ok(order) } else { Err(Denied) }
}

/// The business state does not allow the refund.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusinessRefusal;

/// The business validator: the order is `paid`, the refund is at most what was paid,
/// and in the order's currency.
///
/// # Errors
///
/// [`BusinessRefusal`] otherwise.
pub fn check_business(arguments: &Value, order: &Order) -> Result<(), BusinessRefusal> {
    let amount = arguments.get("amount_minor").and_then(Value::as_i64).ok_or(BusinessRefusal)?;
    let currency = arguments.get("currency").and_then(Value::as_str).ok_or(BusinessRefusal)?;
    if order.status == "paid" && amount <= order.amount_minor && currency == order.currency {
        Ok(())
    } else {
        Err(BusinessRefusal)
    }
}
