//! The tool registry (SPEC §4.1): tools, their six revisions, their schemas, and the
//! registered provider profiles.
//!
//! A schema is a table of fields, so a second tool is a table entry, not new code.
//! [`Registry::builtin`] is the compiled-in registry; tests build others to simulate a
//! contract that drifted after an intent was accepted.

use serde_json::{Map, Value, json};
use toolledger_json::{V2_INTEGER_MAX, V2_INTEGER_MIN};

/// The six revisions that pin what a tool call means.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Revisions {
    /// Input schema revision.
    pub input: String,
    /// Output schema revision.
    pub output: String,
    /// Side-effect semantics revision.
    pub effect: String,
    /// Handler implementation revision.
    pub handler: String,
    /// Producer (this runtime) revision.
    pub producer: String,
    /// Policy revision.
    pub policy: String,
}

impl Revisions {
    /// The `revisions` object of SPEC §4.2:
    /// `{"input","output","effect","handler","producer","policy"}`.
    pub fn to_json(&self) -> Value {
        json!({
            "input": self.input,
            "output": self.output,
            "effect": self.effect,
            "handler": self.handler,
            "producer": self.producer,
            "policy": self.policy,
        })
    }
}

/// Whether a tool changes the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Reads only.
    Read,
    /// Has a side effect: goes through the ledger and outbox.
    Write,
}

/// A provider/API/adapter triple. Only registered triples are accepted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProviderProfile {
    /// e.g. `openai`.
    pub provider: String,
    /// e.g. `responses`.
    pub api_family: String,
    /// e.g. `openai-responses-2026-05`.
    pub adapter_revision: String,
}

impl ProviderProfile {
    fn new(provider: &str, api_family: &str, adapter_revision: &str) -> ProviderProfile {
        ProviderProfile {
            provider: provider.to_owned(),
            api_family: api_family.to_owned(),
            adapter_revision: adapter_revision.to_owned(),
        }
    }
}

/// Which bytes a text field may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charset {
    /// `[A-Za-z0-9_-]`.
    Slug,
    /// `[A-Z]`.
    Upper,
    /// `[0-9a-f]`.
    LowerHex,
}

impl Charset {
    fn allows(self, byte: u8) -> bool {
        match self {
            Charset::Slug => byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-',
            Charset::Upper => byte.is_ascii_uppercase(),
            Charset::LowerHex => matches!(byte, b'0'..=b'9' | b'a'..=b'f'),
        }
    }
}

/// The rule of one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldRule {
    /// A string: `prefix`, then `len_min..=len_max` bytes from `charset`, and nothing else.
    Text {
        /// Literal prefix, possibly empty.
        prefix: &'static str,
        /// Fewest bytes after the prefix.
        len_min: usize,
        /// Most bytes after the prefix.
        len_max: usize,
        /// What those bytes may be.
        charset: Charset,
    },
    /// A JSON integer (never a bool) in `min..=max`.
    Integer {
        /// Smallest allowed.
        min: i64,
        /// Largest allowed.
        max: i64,
    },
    /// One of these strings.
    OneOf(&'static [&'static str]),
    /// Exactly this string.
    Const(&'static str),
    /// Output only: must equal the input's member of the same name (the input binding).
    SameAsInput,
}

/// One member of an object schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The member's name.
    pub name: &'static str,
    /// Its rule.
    pub rule: FieldRule,
}

/// An object schema: exactly these members, no others, each satisfying its rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    /// The members, all required.
    pub fields: Vec<Field>,
}

/// Why a value failed a schema. Names only the schema's member, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// The value is not a JSON object.
    #[error("not an object")]
    NotAnObject,
    /// A required member is absent.
    #[error("member {0} is missing")]
    Missing(&'static str),
    /// A member the schema does not name is present.
    #[error("an unknown member is present")]
    Unknown,
    /// A member breaks its rule.
    #[error("member {0} breaks its rule")]
    Invalid(&'static str),
    /// An output member differs from the input member it is bound to.
    #[error("member {0} is not bound to the input")]
    NotBound(&'static str),
}

impl Schema {
    /// Checks `value` against this schema. `input` is the call's arguments, for
    /// [`FieldRule::SameAsInput`] members; pass `None` for an input schema.
    ///
    /// # Errors
    ///
    /// The first [`SchemaError`] found.
    pub fn validate(
        &self,
        value: &Value,
        input: Option<&Map<String, Value>>,
    ) -> Result<(), SchemaError> {
        let members = value.as_object().ok_or(SchemaError::NotAnObject)?;
        for field in &self.fields {
            let member = members.get(field.name).ok_or(SchemaError::Missing(field.name))?;
            if !field.rule.accepts(member, field.name, input) {
                return Err(match field.rule {
                    FieldRule::SameAsInput => SchemaError::NotBound(field.name),
                    _ => SchemaError::Invalid(field.name),
                });
            }
        }
        if members.len() != self.fields.len() {
            return Err(SchemaError::Unknown);
        }
        Ok(())
    }
}

impl FieldRule {
    fn accepts(&self, value: &Value, name: &str, input: Option<&Map<String, Value>>) -> bool {
        match *self {
            FieldRule::Text { prefix, len_min, len_max, charset } => {
                value.as_str().and_then(|text| text.strip_prefix(prefix)).is_some_and(|rest| {
                    (len_min..=len_max).contains(&rest.len())
                        && rest.bytes().all(|byte| charset.allows(byte))
                })
            }
            // `as_i64` is `None` for bools, fractions and exponents: serde_json keeps
            // those apart from integers.
            FieldRule::Integer { min, max } => {
                value.as_i64().is_some_and(|number| (min..=max).contains(&number))
            }
            FieldRule::OneOf(allowed) => value.as_str().is_some_and(|text| allowed.contains(&text)),
            FieldRule::Const(expected) => value.as_str() == Some(expected),
            FieldRule::SameAsInput => input.and_then(|input| input.get(name)) == Some(value),
        }
    }
}

/// One tool's contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolSpec {
    /// The tool's name, as the model calls it.
    pub name: String,
    /// Read or write.
    pub effect: Effect,
    /// Whether a new intent needs an approval.
    pub approval_required: bool,
    /// Its six revisions.
    pub revisions: Revisions,
    /// What the arguments must be.
    pub input: Schema,
    /// What the downstream's output must be, bound to the input.
    pub output: Schema,
    /// The argument that names the business resource (authorization looks it up).
    pub resource_argument: &'static str,
}

/// The registered tools and provider profiles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    tools: Vec<ToolSpec>,
    profiles: Vec<ProviderProfile>,
}

/// The input schema of `refund_order`.
fn refund_order_input() -> Schema {
    Schema {
        fields: vec![
            Field {
                name: "order_id",
                rule: FieldRule::Text {
                    prefix: "",
                    len_min: 1,
                    len_max: 64,
                    charset: Charset::Slug,
                },
            },
            Field { name: "amount_minor", rule: FieldRule::Integer { min: 1, max: 100_000_000 } },
            Field {
                name: "currency",
                rule: FieldRule::Text {
                    prefix: "",
                    len_min: 3,
                    len_max: 3,
                    charset: Charset::Upper,
                },
            },
            Field {
                name: "reason",
                rule: FieldRule::OneOf(&[
                    "damaged",
                    "not_delivered",
                    "duplicate",
                    "customer_request",
                ]),
            },
        ],
    }
}

/// The output schema of `refund_order`.
fn refund_order_output() -> Schema {
    Schema {
        fields: vec![
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
        ],
    }
}

impl Registry {
    /// The compiled-in registry: `refund_order` and the three profiles of SPEC §4.1.
    pub fn builtin() -> Registry {
        let refund_order = ToolSpec {
            name: "refund_order".to_owned(),
            effect: Effect::Write,
            approval_required: true,
            revisions: Revisions {
                input: "refund_order.input.v2".to_owned(),
                output: "refund_order.output.v2".to_owned(),
                effect: "refund_order.effect.v1".to_owned(),
                handler: "refund_order.handler.v1".to_owned(),
                producer: "toolledger.producer.v1".to_owned(),
                policy: "refund_order.policy.v1".to_owned(),
            },
            input: refund_order_input(),
            output: refund_order_output(),
            resource_argument: "order_id",
        };
        Registry::new(
            vec![refund_order],
            vec![
                ProviderProfile::new("openai", "responses", "openai-responses-2026-05"),
                ProviderProfile::new("openai", "chat_completions", "openai-chat-2026-05"),
                ProviderProfile::new("anthropic", "messages", "anthropic-messages-2026-05"),
            ],
        )
    }

    /// A registry of the given tools and profiles.
    pub fn new(tools: Vec<ToolSpec>, profiles: Vec<ProviderProfile>) -> Registry {
        Registry { tools, profiles }
    }

    /// The tool named `name`, if registered.
    pub fn tool(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.iter().find(|tool| tool.name == name)
    }

    /// Every registered tool.
    pub fn tools(&self) -> &[ToolSpec] {
        &self.tools
    }

    /// Whether `profile` is registered.
    pub fn has_profile(&self, profile: &ProviderProfile) -> bool {
        self.profiles.contains(profile)
    }

    /// Every registered provider profile.
    pub fn profiles(&self) -> &[ProviderProfile] {
        &self.profiles
    }
}

// The integer rule never reaches beyond the v2 domain.
const _: () = assert!(100_000_000 <= V2_INTEGER_MAX && 1 >= V2_INTEGER_MIN);
