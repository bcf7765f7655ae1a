//! `refund_order`: the built-in tool, one [`ToolRules`] implementation among any a host
//! registers. Its business context is a list of orders:
//! `{"orders":[{"order_id","tenant_id","owner_subject_id","status","amount_minor","currency"}]}`.

use std::{collections::BTreeSet, sync::Arc};

use serde_json::Value;

use crate::{
    ApprovalPolicy, BusinessRefusal, ContractError, Denied, Identifier, Revisions, RuleCall,
    ToolDefinition, ToolRules, ToolSpec,
    case::Members,
    registry::{Charset, Field, FieldRule, Schema},
};

/// The role that lets a subject act on another subject's orders in the same tenant.
pub const SUPPORT_ADMIN: &str = "support_admin";

/// One order of the refund tool's business context.
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

/// The rules of `refund_order`:
///
/// - **authorize**: the order named by `order_id` exists in the principal's tenant and
///   is the subject's own, or the subject holds [`SUPPORT_ADMIN`];
/// - **business**: the order is `paid`, the refund is at most what was paid, in the
///   order's currency;
/// - **approval**: required, or — with a threshold — required above it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RefundOrder {
    /// Refunds of at most this many minor units need no approval; `None` (the
    /// default): every refund needs one.
    pub approval_threshold_minor: Option<i64>,
}

/// The shipped definition of `refund_order` (`crates/contract/tools/refund_order.toml`).
pub const REFUND_ORDER_DEFINITION: &str = include_str!("../tools/refund_order.toml");

impl RefundOrder {
    /// The tool: the shipped definition ([`REFUND_ORDER_DEFINITION`]) composed with
    /// these rules.
    ///
    /// ```
    /// let tool = toolledger_contract::RefundOrder::default().tool();
    /// assert_eq!(tool.revisions.input, "refund_order.input.v2");
    /// assert!(matches!(tool.input, toolledger_contract::Schema::Json { .. }));
    /// ```
    pub fn tool(self) -> ToolSpec {
        // Read once per process: every registry and every command starts from it.
        static SHIPPED: std::sync::LazyLock<Option<ToolDefinition>> =
            std::sync::LazyLock::new(|| {
                ToolDefinition::from_document("refund_order.toml", &definition_document()).ok()
            });
        match SHIPPED.as_ref() {
            Some(definition) => definition.tool_with(Some(Arc::new(self)), None),
            // The shipped definition is a constant, read by a test on every build: this
            // arm is the same tool, written as the code-defined table.
            None => self.code_defined(),
        }
    }

    /// The same tool defined in code: its schemas as [`Schema::Fields`] tables. Equal
    /// digests, the same answers; what the benchmark compares the definition with.
    pub fn code_defined(self) -> ToolSpec {
        ToolSpec::new(
            "refund_order",
            Revisions {
                input: "refund_order.input.v2".to_owned(),
                output: "refund_order.output.v2".to_owned(),
                effect: "refund_order.effect.v1".to_owned(),
                handler: "refund_order.handler.v1".to_owned(),
                producer: "toolledger.producer.v1".to_owned(),
                policy: "refund_order.policy.v1".to_owned(),
            },
            input(),
            output(),
            self,
        )
    }
}

fn definition_document() -> Value {
    crate::parse_document("refund_order.toml", REFUND_ORDER_DEFINITION.as_bytes())
        .unwrap_or(Value::Null)
}

/// The input schema of `refund_order`.
fn input() -> Schema {
    Schema::Fields(vec![
        Field {
            name: "order_id",
            rule: FieldRule::Text { prefix: "", len_min: 1, len_max: 64, charset: Charset::Slug },
        },
        Field { name: "amount_minor", rule: FieldRule::Integer { min: 1, max: 100_000_000 } },
        Field {
            name: "currency",
            rule: FieldRule::Text { prefix: "", len_min: 3, len_max: 3, charset: Charset::Upper },
        },
        Field {
            name: "reason",
            rule: FieldRule::OneOf(&["damaged", "not_delivered", "duplicate", "customer_request"]),
        },
    ])
}

/// The output schema of `refund_order`.
fn output() -> Schema {
    Schema::Fields(vec![
        Field {
            name: "refund_id",
            rule: FieldRule::Text {
                prefix: "rf_",
                len_min: 32,
                len_max: 32,
                charset: Charset::LowerHex,
            },
        },
        Field { name: "order_id", rule: FieldRule::SameAsInput },
        Field { name: "amount_minor", rule: FieldRule::SameAsInput },
        Field { name: "currency", rule: FieldRule::SameAsInput },
        Field { name: "status", rule: FieldRule::Const("refunded") },
    ])
}

/// `^[A-Za-z0-9_-]{1,64}$`, the input schema's order id.
fn is_order_id(text: &str) -> bool {
    (1..=64).contains(&text.len())
        && text.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
}

fn invalid(reason: String) -> ContractError {
    ContractError::FixtureInvalid { reason }
}

/// The orders of a business context, every one checked, unique by id.
///
/// # Errors
///
/// What is wrong, naming members only.
pub fn orders(context: &Value) -> Result<Vec<Order>, String> {
    let reason = |err: ContractError| match err {
        ContractError::FixtureInvalid { reason } => reason,
        other => other.to_string(),
    };
    let mut state = Members::of(context, "business_state", invalid).map_err(reason)?;
    let mut orders = Vec::new();
    let mut order_ids = BTreeSet::new();
    for order in state.array("orders").map_err(reason)? {
        let order = order_of(order).map_err(reason)?;
        if !order_ids.insert(order.order_id.clone()) {
            return Err("business_state.orders[] has a duplicate order_id".to_owned());
        }
        orders.push(order);
    }
    state.finish().map_err(reason)?;
    Ok(orders)
}

fn order_of(value: &Value) -> Result<Order, ContractError> {
    let mut members = Members::of(value, "business_state.orders[]", invalid)?;
    let order_id = members.text("order_id")?;
    if !is_order_id(order_id) {
        return Err(invalid(
            "business_state.orders[].order_id must match the order id pattern".to_owned(),
        ));
    }
    let currency = members.text("currency")?;
    if currency.len() != 3 || !currency.bytes().all(|byte| byte.is_ascii_uppercase()) {
        return Err(invalid(
            "business_state.orders[].currency must be three capital letters".to_owned(),
        ));
    }
    let amount_minor = members.integer("amount_minor")?;
    if amount_minor < 0 {
        return Err(invalid(
            "business_state.orders[].amount_minor must not be negative".to_owned(),
        ));
    }
    let order = Order {
        order_id: order_id.to_owned(),
        tenant_id: members.id("tenant_id")?,
        owner_subject_id: members.id("owner_subject_id")?,
        status: members.text("status")?.to_owned(),
        amount_minor,
        currency: currency.to_owned(),
    };
    members.finish()?;
    Ok(order)
}

/// The fields of the order the call's `order_id` names, read in place (no copy, no
/// allocation: this runs at every check of every call).
struct OrderView<'a> {
    tenant_id: &'a str,
    owner_subject_id: &'a str,
    status: &'a str,
    amount_minor: i64,
    currency: &'a str,
}

fn order_of_call<'a>(call: &RuleCall<'a>) -> Option<OrderView<'a>> {
    let order_id = call.arguments.get("order_id").and_then(Value::as_str)?;
    let order = call
        .context
        .get("orders")
        .and_then(Value::as_array)?
        .iter()
        .find(|order| order.get("order_id").and_then(Value::as_str) == Some(order_id))?;
    let text = |name: &str| order.get(name).and_then(Value::as_str);
    Some(OrderView {
        tenant_id: text("tenant_id")?,
        owner_subject_id: text("owner_subject_id")?,
        status: text("status")?,
        amount_minor: order.get("amount_minor").and_then(Value::as_i64)?,
        currency: text("currency")?,
    })
}

impl ToolRules for RefundOrder {
    fn authorize(&self, call: &RuleCall<'_>) -> Result<(), Denied> {
        let order = order_of_call(call).ok_or(Denied)?;
        let in_tenant = order.tenant_id == call.tenant_id.as_str();
        let owns = order.owner_subject_id == call.subject_id.as_str();
        let admin = call.roles.iter().any(|role| role == SUPPORT_ADMIN);
        if in_tenant && (owns || admin) { Ok(()) } else { Err(Denied) }
    }

    fn check_business(&self, call: &RuleCall<'_>) -> Result<(), BusinessRefusal> {
        let order = order_of_call(call).ok_or(BusinessRefusal)?;
        let amount =
            call.arguments.get("amount_minor").and_then(Value::as_i64).ok_or(BusinessRefusal)?;
        let currency =
            call.arguments.get("currency").and_then(Value::as_str).ok_or(BusinessRefusal)?;
        if order.status == "paid" && amount <= order.amount_minor && currency == order.currency {
            Ok(())
        } else {
            Err(BusinessRefusal)
        }
    }

    fn approval(&self, arguments: &Value) -> ApprovalPolicy {
        let amount = arguments.get("amount_minor").and_then(Value::as_i64);
        match (self.approval_threshold_minor, amount) {
            (Some(threshold), Some(amount)) if amount <= threshold => ApprovalPolicy::NotRequired,
            _ => ApprovalPolicy::Required,
        }
    }

    fn check_context(&self, context: &Value) -> Result<(), String> {
        orders(context).map(|_| ())
    }
}
