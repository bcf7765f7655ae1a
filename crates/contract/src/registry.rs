//! The tool registry (`docs/contract.md`): tools, their six revisions, their schemas, and the
//! registered provider profiles.
//!
//! A schema is a table of fields, so a second tool is a table entry, not new code.
//! [`Registry::builtin`] is the compiled-in registry; tests build others to simulate a
//! contract that drifted after an intent was accepted.

use std::sync::Arc;

use serde_json::{Map, Value, json};
use toolledger_json::{V2_INTEGER_MAX, V2_INTEGER_MIN};

use crate::{ApprovalRule, Binding, InvalidValue, JsonSchema, RefundOrder, Rejection, ToolRules};

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
    /// The `revisions` object of the contract:
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
    /// A profile of these three names.
    pub fn new(provider: &str, api_family: &str, adapter_revision: &str) -> ProviderProfile {
        ProviderProfile {
            provider: provider.to_owned(),
            api_family: api_family.to_owned(),
            adapter_revision: adapter_revision.to_owned(),
        }
    }
}

/// Who performs a tool's side effect: a downstream's name and revision. Commit A
/// records it with the intent, and only a downstream of the same identity may work or
/// reconcile the operation afterwards (`DOWNSTREAM_MISMATCH` otherwise).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DownstreamIdentity {
    name: String,
    revision: String,
}

impl DownstreamIdentity {
    /// The identity `name` at `revision`, each 1–128 bytes of `[A-Za-z0-9._:/-]`.
    ///
    /// # Errors
    ///
    /// [`InvalidValue`] when either part is empty, too long or holds another byte.
    ///
    /// # Example
    ///
    /// ```
    /// let payments = toolledger_contract::DownstreamIdentity::new("acme-payments", "2026-11").unwrap();
    /// assert_eq!(payments.to_string(), "acme-payments@2026-11");
    /// ```
    pub fn new(name: &str, revision: &str) -> Result<DownstreamIdentity, InvalidValue> {
        let valid = |text: &str| {
            (1..=128).contains(&text.len())
                && text.bytes().all(|byte| {
                    byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b':' | b'/' | b'-')
                })
        };
        if valid(name) && valid(revision) {
            Ok(DownstreamIdentity { name: name.to_owned(), revision: revision.to_owned() })
        } else {
            Err(InvalidValue { what: "downstream identity" })
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The revision.
    pub fn revision(&self) -> &str {
        &self.revision
    }
}

/// `name@revision`.
impl std::fmt::Display for DownstreamIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.name, self.revision)
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

/// What a tool's arguments or output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum Schema {
    /// The table form, for tools defined in code: an object of exactly these members,
    /// all required, each satisfying its rule.
    Fields(Vec<Field>),
    /// A JSON Schema (draft 2020-12) from a tool definition, and for an output the
    /// members bound to the input.
    Json {
        /// The compiled schema.
        schema: JsonSchema,
        /// Output members that must equal input members (empty for an input schema).
        bindings: Vec<Binding>,
    },
}

/// Why a value failed a schema. Names only the schema's member, or a JSON pointer and a
/// keyword, never the value.
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
    /// A JSON Schema refused the value: where, and which keyword.
    #[error("at {:?}: {}", .0.pointer, .0.keyword)]
    Rejected(Rejection),
    /// An output member (a JSON pointer) differs from the input member it is bound to.
    #[error("at {0:?}: not bound to the input")]
    NotBoundAt(String),
}

impl SchemaError {
    /// Whether the value broke an input binding (rather than the schema itself).
    pub fn is_binding(&self) -> bool {
        matches!(self, SchemaError::NotBound(_) | SchemaError::NotBoundAt(_))
    }

    /// The JSON pointer and keyword a JSON Schema named, if it was one.
    pub fn rejection(&self) -> Option<&Rejection> {
        match self {
            SchemaError::Rejected(rejection) => Some(rejection),
            _ => None,
        }
    }
}

impl Schema {
    /// Checks `value` against this schema. `input` is the call's arguments, for the
    /// input bindings of an output schema; pass `None` for an input schema.
    ///
    /// # Errors
    ///
    /// The first [`SchemaError`] found.
    pub fn validate(&self, value: &Value, input: Option<&Value>) -> Result<(), SchemaError> {
        match self {
            Schema::Fields(fields) => {
                validate_fields(fields, value, input.and_then(Value::as_object))
            }
            Schema::Json { schema, bindings } => {
                schema.check(value).map_err(SchemaError::Rejected)?;
                for binding in bindings {
                    let bound = input.and_then(|input| pointer(input, &binding.input));
                    if pointer(value, &binding.output) != bound {
                        return Err(SchemaError::NotBoundAt(binding.output.clone()));
                    }
                }
                Ok(())
            }
        }
    }
}

/// `value.pointer(at)`, read the way serde_json reads a JSON pointer, without its two
/// `String`s per segment: a segment is unescaped (`~1` then `~0`) only when it holds a
/// `~`. An output's bindings are checked on every receipt and every replay, and
/// serde_json's allocations were most of an output validation's time.
fn pointer<'v>(value: &'v Value, at: &str) -> Option<&'v Value> {
    if at.is_empty() {
        return Some(value);
    }
    at.strip_prefix('/')?.split('/').try_fold(value, |target, segment| {
        let token = if segment.contains('~') {
            std::borrow::Cow::Owned(segment.replace("~1", "/").replace("~0", "~"))
        } else {
            std::borrow::Cow::Borrowed(segment)
        };
        match target {
            Value::Object(members) => members.get(token.as_ref()),
            // serde_json's array index: decimal digits, no sign, no leading zero.
            Value::Array(items) => {
                let leading_zero = token.starts_with('0') && token.len() != 1;
                if token.starts_with('+') || leading_zero {
                    return None;
                }
                token.parse::<usize>().ok().and_then(|index| items.get(index))
            }
            _ => None,
        }
    })
}

fn validate_fields(
    fields: &[Field],
    value: &Value,
    input: Option<&Map<String, Value>>,
) -> Result<(), SchemaError> {
    let members = value.as_object().ok_or(SchemaError::NotAnObject)?;
    for field in fields {
        let member = members.get(field.name).ok_or(SchemaError::Missing(field.name))?;
        if !field.rule.accepts(member, field.name, input) {
            return Err(match field.rule {
                FieldRule::SameAsInput => SchemaError::NotBound(field.name),
                _ => SchemaError::Invalid(field.name),
            });
        }
    }
    if members.len() != fields.len() {
        return Err(SchemaError::Unknown);
    }
    Ok(())
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

/// One tool's contract: its data (name, six revisions, input and output schemas) and
/// its behaviour (the [`ToolRules`] the host registers with it).
#[derive(Clone)]
pub struct ToolSpec {
    /// The tool's name, as the model calls it.
    pub name: String,
    /// What it does, for the model (empty for a tool defined in code without one).
    pub description: String,
    /// Its six revisions.
    pub revisions: Revisions,
    /// What the arguments must be.
    pub input: Schema,
    /// What the downstream's output must be, bound to the input.
    pub output: Schema,
    /// Who may call it on what, the business precondition, the approval policy.
    pub rules: Arc<dyn ToolRules>,
    /// How many times a relay sends a request that was not sent before the event is
    /// `dead` (default 5).
    pub max_attempts: u32,
    /// The approval policy's data: approver roles, the longest validity, and when the
    /// approval must be valid (a code-defined tool: the defaults, today's rule).
    pub approval: ApprovalRule,
}

impl ToolSpec {
    /// A tool of these revisions, schemas and rules.
    pub fn new(
        name: &str,
        revisions: Revisions,
        input: Schema,
        output: Schema,
        rules: impl ToolRules + 'static,
    ) -> ToolSpec {
        ToolSpec {
            name: name.to_owned(),
            description: String::new(),
            revisions,
            input,
            output,
            rules: Arc::new(rules),
            max_attempts: 5,
            approval: ApprovalRule::default(),
        }
    }

    /// The same tool, with a relay giving up after `max_attempts` sends that did not go
    /// out (at least 1).
    ///
    /// ```
    /// let refunds = toolledger_contract::RefundOrder::default().tool().with_max_attempts(3);
    /// assert_eq!(refunds.max_attempts, 3);
    /// ```
    pub fn with_max_attempts(mut self, max_attempts: u32) -> ToolSpec {
        self.max_attempts = max_attempts.max(1);
        self
    }
}

impl std::fmt::Debug for ToolSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolSpec")
            .field("name", &self.name)
            .field("revisions", &self.revisions)
            .field("input", &self.input)
            .field("output", &self.output)
            .field("rules", &self.rules)
            .field("max_attempts", &self.max_attempts)
            .field("approval", &self.approval)
            .finish()
    }
}

/// Two tools are the same contract when their data is; rules are behaviour, compared
/// by identity.
impl PartialEq for ToolSpec {
    fn eq(&self, other: &ToolSpec) -> bool {
        self.name == other.name
            && self.revisions == other.revisions
            && self.input == other.input
            && self.output == other.output
            && self.max_attempts == other.max_attempts
            && self.description == other.description
            && self.approval == other.approval
            && Arc::ptr_eq(&self.rules, &other.rules)
    }
}

/// The registered tools and provider profiles.
#[derive(Debug, Clone, PartialEq)]
pub struct Registry {
    tools: Vec<ToolSpec>,
    profiles: Vec<ProviderProfile>,
}

/// The provider profiles every registry starts from.
pub fn builtin_profiles() -> Vec<ProviderProfile> {
    vec![
        ProviderProfile::new("openai", "responses", "openai-responses-2026-05"),
        ProviderProfile::new("openai", "chat_completions", "openai-chat-2026-05"),
        ProviderProfile::new("anthropic", "messages", "anthropic-messages-2026-05"),
    ]
}

impl Registry {
    /// The compiled-in registry: `refund_order` (approval always required) and the
    /// three built-in provider profiles.
    pub fn builtin() -> Registry {
        Registry::new(vec![RefundOrder::default().tool()], builtin_profiles())
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

// The refund tool's integer rule never reaches beyond the v2 domain.
const _: () = assert!(100_000_000 <= V2_INTEGER_MAX && 1 >= V2_INTEGER_MIN);

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// The bindings' pointer reads exactly what serde_json's `Value::pointer` reads.
    #[test]
    fn pointer_is_serde_jsons() {
        let value = json!({"a": {"b/c": [1, {"~d": 2, "~1": 3, "": 4}], "0": 5}, "": {"": 6},
            "e~f": 7, "x": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]});
        let pointers = [
            "",
            "/",
            "//",
            "/a",
            "/a/b~1c",
            "/a/b~1c/0",
            "/a/b~1c/1/~0d",
            "/a/b~1c/1/~01",
            "/a/b~1c/1/~1",
            "/a/b~1c/1/",
            "/a/0",
            "/e~0f",
            "/e~f",
            "/e~1f",
            "/x/0",
            "/x/11",
            "/x/12",
            "/x/01",
            "/x/+1",
            "/x/-1",
            "/x/1.0",
            "/x/ 1",
            "/x/",
            "/x/00",
            "a",
            "#/a",
            "/a/b~1c/0/0",
            "/missing",
            "/a/b~2c",
            "/a/b~",
            "/x/99999999999999999999999",
        ];
        for at in pointers {
            assert_eq!(super::pointer(&value, at), value.pointer(at), "{at:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_pointer_reads_what_serde_json_reads(at in "[/~01ab+ -]{0,12}") {
            let value = json!({"a": [{"b": 1}, {"~": 2, "/": 3}], "~": {"/": [4, 5]},
                "/": {"0": 6, "": 7}, "": [8], "a~b": 9, "1": {"01": 10}});
            proptest::prop_assert_eq!(super::pointer(&value, &at), value.pointer(&at));
        }
    }
}
