//! Tool definitions as data (`docs/tools.md`): a tool's name, description, JSON Schemas,
//! input bindings, revisions and policies, read from a TOML or JSON document.
//!
//! This module reads bytes it is handed; finding and reading files, and the `downstream`
//! member (where the effect is performed), belong to the host library.

use std::{collections::BTreeSet, fmt, sync::Arc};

use serde_json::{Map, Value};

use crate::{
    ApprovalPolicy, BusinessRefusal, Denied, Revisions, RuleCall, ToolRules, ToolSpec,
    rules::{Precondition, Verdict},
    schema::{JsonSchema, is_pointer},
};

/// The largest definition document, in bytes.
pub const DEFINITION_BYTES_MAX: usize = 1024 * 1024;

/// The longest description.
const DESCRIPTION_BYTES_MAX: usize = 8 * 1024;

/// Why a definition was refused: the file, a JSON pointer into the definition, and the
/// reason, so a person can act on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: at {}: {reason}", if pointer.is_empty() { "the top" } else { pointer.as_str() })]
pub struct DefinitionError {
    /// The file (as the caller named it).
    pub file: String,
    /// Where, as a JSON pointer into the definition (`""` is the whole document).
    pub pointer: String,
    /// What is wrong.
    pub reason: String,
}

/// One output member that must equal one input member (JSON pointers), both present or
/// both absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// Where in the output.
    pub output: String,
    /// Where in the arguments.
    pub input: String,
}

/// When an approval must be valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ApprovalValidAt {
    /// When the intent is accepted (then consumed: a queued event is not re-judged).
    #[default]
    Acceptance,
    /// At acceptance and again right before the side effect: an approval that expired
    /// while the event waited ends the operation `failed`, with nothing sent.
    Effect,
}

/// A tool's approval policy, as data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ApprovalRule {
    /// Whether every call needs an approval.
    pub required: bool,
    /// The roles one of which the approver must hold *now* (asked of the resolver);
    /// empty: the call's list of eligible approvers decides, as for a code-defined tool.
    pub approver_roles: Vec<String>,
    /// The longest validity (`expires_at - approved_at`) an approval may have.
    pub max_validity_seconds: Option<i64>,
    /// When it must be valid.
    pub valid_at: ApprovalValidAt,
}

/// Who may act on whose resource, as data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Authorization {
    /// The argument (a JSON pointer) naming the subject who owns the resource; `None`:
    /// the call acts on the principal's own behalf, and any principal may make it.
    pub owner: Option<String>,
    /// The roles that may act on another subject's resource (asked of the resolver at
    /// every step).
    pub act_for_others: Vec<String>,
}

/// A tool read from a definition document.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDefinition {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// What the arguments must be.
    pub input: JsonSchema,
    /// What the downstream's output must be.
    pub output: JsonSchema,
    /// Output members bound to input members.
    pub bindings: Vec<Binding>,
    /// The six revisions, given or derived.
    pub revisions: Revisions,
    /// The approval policy.
    pub approval: ApprovalRule,
    /// The authorization rule.
    pub authorization: Authorization,
    /// The business precondition's lookup: a path template over the arguments'
    /// top-level members (`/orders/{order_id}/refundable`), asked of the tool's
    /// downstream at acceptance and right before the effect.
    pub precondition: Option<String>,
    /// How many sends that did not go out before a relay gives up.
    pub max_attempts: u32,
    /// The `downstream` member, as written: read by the host library, not here.
    pub downstream: Option<Value>,
}

/// The members a definition may hold.
const MEMBERS: [&str; 12] = [
    "name",
    "description",
    "input_schema",
    "output_schema",
    "output_bindings",
    "revisions",
    "approval",
    "authorization",
    "precondition",
    "max_attempts",
    "downstream",
    "$comment",
];

struct Reader<'a> {
    file: &'a str,
}

impl Reader<'_> {
    fn error(&self, pointer: &str, reason: impl Into<String>) -> DefinitionError {
        DefinitionError {
            file: self.file.to_owned(),
            pointer: pointer.to_owned(),
            reason: reason.into(),
        }
    }

    fn object<'v>(
        &self,
        value: &'v Value,
        at: &str,
        allowed: &[&str],
    ) -> Result<&'v Map<String, Value>, DefinitionError> {
        let members =
            value.as_object().ok_or_else(|| self.error(at, "must be a table (an object)"))?;
        for name in members.keys() {
            if !allowed.contains(&name.as_str()) {
                return Err(self.error(
                    &format!("{at}/{name}"),
                    format!("unknown member {name:?}; allowed: {}", allowed.join(", ")),
                ));
            }
        }
        Ok(members)
    }

    fn text<'v>(
        &self,
        members: &'v Map<String, Value>,
        at: &str,
        name: &str,
    ) -> Result<Option<&'v str>, DefinitionError> {
        match members.get(name) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(self.error(&format!("{at}/{name}"), "must be a string")),
        }
    }

    fn roles(
        &self,
        members: &Map<String, Value>,
        at: &str,
        name: &str,
    ) -> Result<Vec<String>, DefinitionError> {
        let here = format!("{at}/{name}");
        let Some(value) = members.get(name) else { return Ok(Vec::new()) };
        let items = value.as_array().ok_or_else(|| self.error(&here, "must be a list of roles"))?;
        items
            .iter()
            .map(|item| match item.as_str() {
                Some(role) if is_name(role, 128) => Ok(role.to_owned()),
                _ => Err(self.error(&here, "each role is 1-128 bytes of [A-Za-z0-9_.:-]")),
            })
            .collect()
    }
}

/// `1..=max` bytes of `[A-Za-z0-9_.:-]`.
fn is_name(text: &str, max: usize) -> bool {
    (1..=max).contains(&text.len())
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

/// A tool name: 1–64 bytes of `[A-Za-z0-9_-]`, as every model provider's function
/// calling and MCP accept.
pub fn is_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A revision: 1–128 bytes of `[A-Za-z0-9_.:-]`.
fn is_revision(text: &str) -> bool {
    is_name(text, 128)
}

/// Reads a definition document: JSON when `file` ends in `.json` (strict: duplicate
/// names, lone surrogates and non-finite numbers refused), TOML otherwise.
///
/// # Errors
///
/// [`DefinitionError`] when the bytes are over [`DEFINITION_BYTES_MAX`], not UTF-8, or
/// not a document of that format (TOML's dates and times have no JSON value and are
/// refused).
pub fn parse_document(file: &str, bytes: &[u8]) -> Result<Value, DefinitionError> {
    let reader = Reader { file };
    if bytes.len() > DEFINITION_BYTES_MAX {
        return Err(reader.error(
            "",
            format!(
                "the file is {} bytes, over the {DEFINITION_BYTES_MAX}-byte bound",
                bytes.len()
            ),
        ));
    }
    if file.ends_with(".json") {
        let limits =
            toolledger_json::Limits { size_bytes_max: DEFINITION_BYTES_MAX, depth_max: 64 };
        return toolledger_json::parse_strict(bytes, &limits)
            .map_err(|err| reader.error("", format!("not strict JSON: {err}")));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| reader.error("", "the file is not UTF-8"))?;
    let table: toml::Table = toml::from_str(text).map_err(|err| {
        let at = err.span().map(|span| line_of(text, span.start)).unwrap_or_default();
        reader.error("", format!("not TOML{at}: {}", err.message()))
    })?;
    toml_to_json(&reader, toml::Value::Table(table), "", 0)
}

fn line_of(text: &str, offset: usize) -> String {
    let line = text.get(..offset).map_or(0, |head| head.bytes().filter(|b| *b == b'\n').count());
    format!(" (line {})", line + 1)
}

fn toml_to_json(
    reader: &Reader<'_>,
    value: toml::Value,
    at: &str,
    depth: usize,
) -> Result<Value, DefinitionError> {
    if depth > 64 {
        return Err(reader.error(at, "nested deeper than 64"));
    }
    Ok(match value {
        toml::Value::String(text) => Value::String(text),
        toml::Value::Integer(number) => Value::from(number),
        toml::Value::Float(number) => serde_json::Number::from_f64(number)
            .map(Value::Number)
            .ok_or_else(|| reader.error(at, "a number must be finite"))?,
        toml::Value::Boolean(flag) => Value::Bool(flag),
        toml::Value::Datetime(_) => {
            return Err(reader.error(at, "a TOML date or time has no JSON value; quote it"));
        }
        toml::Value::Array(items) => Value::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(index, item)| {
                    toml_to_json(reader, item, &format!("{at}/{index}"), depth + 1)
                })
                .collect::<Result<_, _>>()?,
        ),
        toml::Value::Table(table) => Value::Object(
            table
                .into_iter()
                .map(|(name, item)| {
                    let here = format!("{at}/{name}");
                    toml_to_json(reader, item, &here, depth + 1).map(|item| (name, item))
                })
                .collect::<Result<_, _>>()?,
        ),
    })
}

impl ToolDefinition {
    /// Reads a definition from a document (see [`parse_document`]).
    ///
    /// # Errors
    ///
    /// [`DefinitionError`] naming the file, the pointer and the reason: an unknown
    /// member, a missing or mistyped one, a schema refused (see [`JsonSchema::compile`]),
    /// a binding or precondition that names what the schemas do not declare.
    ///
    /// # Example
    ///
    /// ```
    /// use toolledger_contract::{ToolDefinition, parse_document};
    ///
    /// let text = br#"
    /// name = "open_ticket"
    /// description = "Open a support ticket."
    /// [input_schema]
    /// type = "object"
    /// properties = { queue = { type = "string" } }
    /// required = ["queue"]
    /// additionalProperties = false
    /// [output_schema]
    /// type = "object"
    /// properties = { ticket_id = { type = "string" }, queue = { type = "string" } }
    /// required = ["ticket_id", "queue"]
    /// [output_bindings]
    /// "/queue" = "/queue"
    /// "#;
    /// let document = parse_document("ticket.toml", text).unwrap();
    /// let tool = ToolDefinition::from_document("ticket.toml", &document).unwrap();
    /// assert!(tool.revisions.input.starts_with("open_ticket.input.d"));
    ///
    /// let typo = parse_document("ticket.toml", b"name = \"t\"\ndescripton = \"x\"").unwrap();
    /// let refused = ToolDefinition::from_document("ticket.toml", &typo).unwrap_err();
    /// assert_eq!(refused.pointer, "/descripton");
    /// ```
    pub fn from_document(file: &str, document: &Value) -> Result<ToolDefinition, DefinitionError> {
        let reader = Reader { file };
        // The definition is the value its canonical form denotes (see `exact_numbers`).
        let document = &crate::schema::exact_numbers(document, "")
            .map_err(|refusal| reader.error(&refusal.pointer, refusal.reason))?;
        let top = reader.object(document, "", &MEMBERS)?;
        let name =
            reader.text(top, "", "name")?.ok_or_else(|| reader.error("/name", "is required"))?;
        if !is_tool_name(name) {
            return Err(reader.error("/name", "a tool name is 1-64 bytes of [A-Za-z0-9_-]"));
        }
        let description = reader
            .text(top, "", "description")?
            .ok_or_else(|| reader.error("/description", "is required"))?;
        if description.len() > DESCRIPTION_BYTES_MAX {
            return Err(reader.error("/description", "is over 8 KiB"));
        }
        let schema = |member: &str| -> Result<JsonSchema, DefinitionError> {
            let value = top
                .get(member)
                .ok_or_else(|| reader.error(&format!("/{member}"), "is required"))?;
            JsonSchema::compile(value.clone()).map_err(|refusal| {
                reader.error(&format!("/{member}{}", refusal.pointer), refusal.reason)
            })
        };
        let input = schema("input_schema")?;
        if let Some(at) = number_type(input.document(), "") {
            return Err(reader.error(
                &format!("/input_schema{at}"),
                "\"number\" admits fractions, which a call's arguments never hold (integers within ±(2^53 − 1)): declare \"integer\", in minor units where it is money",
            ));
        }
        let output = schema("output_schema")?;
        let bindings = bindings(&reader, top)?;
        let approval = approval(&reader, top)?;
        let authorization = authorization(&reader, top)?;
        let precondition = match reader.text(top, "", "precondition")? {
            None => None,
            Some(template) => {
                check_template(&reader, "/precondition", template, &input)?;
                Some(template.to_owned())
            }
        };
        let max_attempts = match top.get("max_attempts") {
            None => 5,
            Some(value) => value
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| (1..=100).contains(n))
                .ok_or_else(|| reader.error("/max_attempts", "a whole number from 1 to 100"))?,
        };
        let revisions = revisions(&reader, top, name)?;
        Ok(ToolDefinition {
            name: name.to_owned(),
            description: description.to_owned(),
            input,
            output,
            bindings,
            revisions,
            approval,
            authorization,
            precondition,
            max_attempts,
            downstream: top.get("downstream").cloned(),
        })
    }

    /// The tool with the definition's own rules only.
    ///
    /// A definition that declares a precondition needs something to ask:
    /// [`ToolDefinition::tool_with`].
    pub fn tool(&self) -> ToolSpec {
        self.tool_with(None, None)
    }

    /// The tool, its definition's rules composed with `code` rules (both must allow;
    /// an approval is required when either requires one) and the `precondition` that
    /// answers the definition's lookup.
    pub fn tool_with(
        &self,
        code: Option<Arc<dyn ToolRules>>,
        precondition: Option<Arc<dyn Precondition>>,
    ) -> ToolSpec {
        let rules = DefinedRules {
            authorization: self.authorization.clone(),
            approval_required: self.approval.required,
            precondition: if self.precondition.is_some() { precondition } else { None },
            code,
        };
        let mut tool = ToolSpec::new(
            &self.name,
            self.revisions.clone(),
            crate::Schema::Json { schema: self.input.clone(), bindings: Vec::new() },
            crate::Schema::Json { schema: self.output.clone(), bindings: self.bindings.clone() },
            rules,
        )
        .with_max_attempts(self.max_attempts);
        tool.description = self.description.clone();
        tool.approval = self.approval.clone();
        tool
    }
}

fn bindings(
    reader: &Reader<'_>,
    top: &Map<String, Value>,
) -> Result<Vec<Binding>, DefinitionError> {
    let Some(value) = top.get("output_bindings") else { return Ok(Vec::new()) };
    let members =
        value.as_object().ok_or_else(|| reader.error("/output_bindings", "must be a table"))?;
    let mut bindings = Vec::new();
    for (output, input) in members {
        let here = format!("/output_bindings/{}", output.replace('~', "~0").replace('/', "~1"));
        let input = input
            .as_str()
            .ok_or_else(|| reader.error(&here, "must be a JSON pointer into the arguments"))?;
        if !is_pointer(output) || output.is_empty() || !is_pointer(input) || input.is_empty() {
            return Err(reader.error(&here, "both sides are JSON pointers such as \"/order_id\""));
        }
        bindings.push(Binding { output: output.clone(), input: input.to_owned() });
    }
    Ok(bindings)
}

fn approval(
    reader: &Reader<'_>,
    top: &Map<String, Value>,
) -> Result<ApprovalRule, DefinitionError> {
    let Some(value) = top.get("approval") else { return Ok(ApprovalRule::default()) };
    let members = reader.object(
        value,
        "/approval",
        &["required", "approver_roles", "max_validity_seconds", "valid_at"],
    )?;
    let required = match members.get("required") {
        None => false,
        Some(Value::Bool(flag)) => *flag,
        Some(_) => return Err(reader.error("/approval/required", "must be true or false")),
    };
    let approver_roles = reader.roles(members, "/approval", "approver_roles")?;
    let max_validity_seconds = match members.get("max_validity_seconds") {
        None => None,
        Some(value) => {
            Some(value.as_i64().filter(|seconds| (1..=31_622_400).contains(seconds)).ok_or_else(
                || {
                    reader.error(
                        "/approval/max_validity_seconds",
                        "whole seconds from 1 to 31622400 (366 days)",
                    )
                },
            )?)
        }
    };
    let valid_at = match reader.text(members, "/approval", "valid_at")? {
        None | Some("acceptance") => ApprovalValidAt::Acceptance,
        Some("effect") => ApprovalValidAt::Effect,
        Some(_) => {
            return Err(reader.error("/approval/valid_at", "\"acceptance\" or \"effect\""));
        }
    };
    if !required && (!approver_roles.is_empty() || max_validity_seconds.is_some()) {
        return Err(reader
            .error("/approval", "approver_roles and max_validity_seconds need required = true"));
    }
    Ok(ApprovalRule { required, approver_roles, max_validity_seconds, valid_at })
}

fn authorization(
    reader: &Reader<'_>,
    top: &Map<String, Value>,
) -> Result<Authorization, DefinitionError> {
    let Some(value) = top.get("authorization") else { return Ok(Authorization::default()) };
    let members = reader.object(value, "/authorization", &["owner", "act_for_others"])?;
    let owner = match reader.text(members, "/authorization", "owner")? {
        None => None,
        Some(pointer) if is_pointer(pointer) && !pointer.is_empty() => Some(pointer.to_owned()),
        Some(_) => {
            return Err(reader.error(
                "/authorization/owner",
                "a JSON pointer into the arguments, such as \"/customer_id\"",
            ));
        }
    };
    let act_for_others = reader.roles(members, "/authorization", "act_for_others")?;
    if owner.is_none() && !act_for_others.is_empty() {
        return Err(reader.error(
            "/authorization/act_for_others",
            "needs an owner: without one, every call acts on the principal's own behalf",
        ));
    }
    Ok(Authorization { owner, act_for_others })
}

/// A template's `{name}` placeholders each name a property the input schema declares
/// and requires; no other braces.
fn check_template(
    reader: &Reader<'_>,
    at: &str,
    template: &str,
    input: &JsonSchema,
) -> Result<(), DefinitionError> {
    for name in placeholders(template).map_err(|reason| reader.error(at, reason))? {
        if !input.requires_property(name) {
            return Err(reader.error(
                at,
                format!("{{{name}}} names no property the input schema declares and requires"),
            ));
        }
    }
    Ok(())
}

/// The `{name}` placeholders of a template.
///
/// # Errors
///
/// An unmatched brace or an empty placeholder.
pub fn placeholders(template: &str) -> Result<Vec<&str>, String> {
    let mut names = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find(['{', '}']) {
        let (head, tail) = rest.split_at(open);
        let _ = head;
        if tail.starts_with('}') {
            return Err("an unmatched \"}\" in the template".to_owned());
        }
        let close = tail.find('}').ok_or("an unmatched \"{\" in the template")?;
        let name = tail.get(1..close).unwrap_or_default();
        if name.is_empty() || name.contains('{') {
            return Err("a placeholder is {name}, one argument's name".to_owned());
        }
        names.push(name);
        rest = tail.get(close + 1..).unwrap_or_default();
    }
    Ok(names)
}

fn revisions(
    reader: &Reader<'_>,
    top: &Map<String, Value>,
    name: &str,
) -> Result<Revisions, DefinitionError> {
    const PARTS: [&str; 6] = ["input", "output", "effect", "handler", "producer", "policy"];
    let given = match top.get("revisions") {
        None => None,
        Some(value) => Some(reader.object(value, "/revisions", &PARTS)?),
    };
    let part = |part: &str, derived: String| -> Result<String, DefinitionError> {
        match given.map(|given| reader.text(given, "/revisions", part)).transpose()?.flatten() {
            Some(text) if is_revision(text) => Ok(text.to_owned()),
            Some(_) => Err(reader.error(
                &format!("/revisions/{part}"),
                "a revision is 1-128 bytes of [A-Za-z0-9_.:-]",
            )),
            None => Ok(derived),
        }
    };
    let digest = |members: &[&str]| {
        let picked: Map<String, Value> = members
            .iter()
            .filter_map(|member| {
                top.get(*member).map(|value| ((*member).to_owned(), value.clone()))
            })
            .collect();
        let digest = crate::digest::sha256_canonical(&Value::Object(picked));
        digest.as_str().get(..16).unwrap_or_default().to_owned()
    };
    Ok(Revisions {
        input: part("input", format!("{name}.input.d{}", digest(&["input_schema"])))?,
        output: part(
            "output",
            format!("{name}.output.d{}", digest(&["output_schema", "output_bindings"])),
        )?,
        effect: part("effect", format!("{name}.effect.v1"))?,
        handler: part("handler", format!("{name}.handler.v1"))?,
        producer: part("producer", "toolledger.producer.v1".to_owned())?,
        policy: part(
            "policy",
            format!(
                "{name}.policy.d{}",
                digest(&["approval", "authorization", "precondition", "max_attempts"])
            ),
        )?,
    })
}

/// A definition's rules, composed with code rules and a precondition where given.
struct DefinedRules {
    authorization: Authorization,
    approval_required: bool,
    precondition: Option<Arc<dyn Precondition>>,
    code: Option<Arc<dyn ToolRules>>,
}

impl fmt::Debug for DefinedRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DefinedRules")
            .field("authorization", &self.authorization)
            .field("approval_required", &self.approval_required)
            .field("precondition", &self.precondition)
            .field("code", &self.code)
            .finish()
    }
}

impl ToolRules for DefinedRules {
    fn authorize(&self, call: &RuleCall<'_>) -> Result<(), Denied> {
        if let Some(code) = &self.code {
            code.authorize(call)?;
        }
        let Some(owner) = &self.authorization.owner else { return Ok(()) };
        let owns =
            call.arguments.pointer(owner).and_then(Value::as_str) == Some(call.subject_id.as_str());
        let acts_for_others =
            call.roles.iter().any(|role| self.authorization.act_for_others.contains(role));
        if owns || acts_for_others { Ok(()) } else { Err(Denied) }
    }

    fn check_business(&self, call: &RuleCall<'_>) -> Result<(), BusinessRefusal> {
        match self.precondition(call) {
            Verdict::Allow => Ok(()),
            _ => Err(BusinessRefusal),
        }
    }

    fn precondition(&self, call: &RuleCall<'_>) -> Verdict {
        if let Some(code) = &self.code {
            let verdict = code.precondition(call);
            if verdict != Verdict::Allow {
                return verdict;
            }
        }
        match &self.precondition {
            Some(precondition) => precondition.ask(call),
            None => Verdict::Allow,
        }
    }

    fn approval(&self, arguments: &Value) -> ApprovalPolicy {
        let code = self.code.as_ref().map(|code| code.approval(arguments));
        if self.approval_required || code == Some(ApprovalPolicy::Required) {
            ApprovalPolicy::Required
        } else {
            ApprovalPolicy::NotRequired
        }
    }

    fn check_context(&self, context: &Value) -> Result<(), String> {
        match &self.code {
            Some(code) => code.check_context(context),
            None if context.is_object() => Ok(()),
            None => Err("business_state must be an object".to_owned()),
        }
    }
}

/// The names a set of definitions declares twice.
pub fn duplicate_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen = BTreeSet::new();
    names.into_iter().filter(|name| !seen.insert(*name)).collect()
}

/// The pointer to the first `type` of `schema` that names `"number"` (alone or in a list):
/// a field declared so would promise fractions the ledger refuses at its door.
fn number_type(schema: &Value, at: &str) -> Option<String> {
    match schema {
        Value::Object(members) => members.iter().find_map(|(name, value)| {
            let here = format!("{at}/{}", name.replace('~', "~0").replace('/', "~1"));
            let names_number = |value: &Value| value.as_str() == Some("number");
            let is_number = name == "type"
                && (names_number(value)
                    || value.as_array().is_some_and(|types| types.iter().any(names_number)));
            if is_number { Some(here) } else { number_type(value, &here) }
        }),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(index, item)| number_type(item, &format!("{at}/{index}"))),
        _ => None,
    }
}
