//! The gateway's tool list: each upstream tool as the host sees it, and for a ledgered
//! one, the ledger's definition of it (`docs/mcp.md`, "Tools").

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use toolledger::{ToolDefinition, ToolSpec};

use crate::config::{ApprovalDecl, LookupDecl, McpConfig, Policy, ToolPolicy};

/// The argument the gateway adds to a ledgered tool's input schema, and removes before
/// forwarding: the model's idempotency key.
pub(crate) const KEY_ARGUMENT: &str = "idempotency_key";

/// The `_meta` member a host sets to give the key itself.
pub(crate) const KEY_META: &str = "io.toolledger/idempotency_key";

/// The gateway's own tool: the purpose-bound status query.
pub(crate) const STATUS_TOOL: &str = "toolledger_status";

/// A description is cut to this many bytes in the ledger's definition (the model sees
/// the upstream's whole text).
const DESCRIPTION_MAX: usize = 8 * 1024;

/// One tool the host sees.
#[derive(Debug, Clone)]
pub(crate) struct Exposed {
    /// Its name toward the host: the upstream's, or `upstream.tool` on a collision.
    pub(crate) name: String,
    /// Which upstream serves it (an index into the configuration's upstreams).
    pub(crate) upstream: usize,
    /// Its name at the upstream.
    pub(crate) upstream_tool: String,
    /// The `tools/list` entry the host sees.
    pub(crate) listing: Value,
    /// How the ledger holds it; `None`: passed through.
    pub(crate) ledgered: Option<Ledgered>,
}

/// A ledgered tool.
#[derive(Debug, Clone)]
pub(crate) struct Ledgered {
    /// Its name in the ledger (in every digest): `upstream-tool`, stable whatever else
    /// the upstreams list.
    pub(crate) ledger_name: String,
    pub(crate) spec: ToolSpec,
    /// The upstream's own key argument, handed the operation's request ref.
    pub(crate) key_argument: Option<String>,
    pub(crate) key_from_arguments: bool,
    pub(crate) lookup: Option<LookupDecl>,
    /// Who approves each new call, when one must be approved.
    pub(crate) approval: Option<ApprovalDecl>,
}

/// What was learned of one upstream's `tools/list`, and each tool refused with why.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub(crate) tools: Vec<Exposed>,
    pub(crate) refused: Vec<String>,
    /// What the configuration says of a tool no upstream lists (a mistyped table, a
    /// lookup naming a missing tool): the gateway does not start with it.
    pub(crate) misnamed: Vec<String>,
}

/// The tools of every upstream (`listings[i]` is upstream `i`'s `tools/list`, as JSON).
///
/// The names the host sees are injective by construction (`docs/mcp.md`, "Names"): a
/// tool keeps its own name when no other tool of any upstream has it, it is not the
/// gateway's status tool, and it does not begin with an upstream's name and a dot;
/// every other tool is `upstream.tool`. Upstream names hold no dot, so a prefixed name
/// splits at its first dot into exactly one (upstream, tool), and no kept name has that
/// shape. An upstream that lists one name twice has that tool refused: which of the two
/// a call meant could not be told.
pub(crate) fn plan(config: &McpConfig, listings: &[Vec<Value>]) -> Plan {
    let mut plan = Plan::default();
    let name_of = |tool: &Value| tool.get("name").and_then(Value::as_str).map(str::to_owned);
    let count = |name: &str| {
        listings
            .iter()
            .map(|tools| tools.iter().filter(|tool| name_of(tool).as_deref() == Some(name)).count())
            .sum::<usize>()
    };
    let prefixed_shape = |name: &str| {
        name.split_once('.')
            .is_some_and(|(head, _)| config.upstreams.iter().any(|upstream| upstream.name == head))
    };
    for (upstream, tools) in config.upstreams.iter().zip(listings) {
        let lists = |name: &str| tools.iter().any(|tool| name_of(tool).as_deref() == Some(name));
        for (name, policy) in &upstream.tools {
            let at = format!("/mcp/upstreams/{}/tools/{name}", upstream.name);
            if !lists(name) {
                plan.misnamed
                    .push(format!("at {at}: upstream {} lists no tool {name}", upstream.name));
            }
            if let Some(lookup) = policy.lookup.as_ref().filter(|lookup| !lists(&lookup.tool)) {
                plan.misnamed.push(format!(
                    "at {at}/lookup/tool: upstream {} lists no tool {}",
                    upstream.name, lookup.tool
                ));
            }
        }
    }
    for (index, (upstream, tools)) in config.upstreams.iter().zip(listings).enumerate() {
        for tool in tools {
            let Some(name) = name_of(tool) else {
                plan.refused.push(format!("{}: a tool without a name", upstream.name));
                continue;
            };
            if tools.iter().filter(|other| name_of(other).as_deref() == Some(&name)).count() > 1 {
                plan.refused.push(format!("{}: {name}: listed twice", upstream.name));
                continue;
            }
            let exposed = if count(&name) > 1 || name == STATUS_TOOL || prefixed_shape(&name) {
                format!("{}.{name}", upstream.name)
            } else {
                name.clone()
            };
            let policy = upstream.tools.get(&name).cloned().unwrap_or_default();
            match expose(&upstream.name, &exposed, tool, &policy) {
                Ok((listing, ledgered)) => plan.tools.push(Exposed {
                    name: exposed,
                    upstream: index,
                    upstream_tool: name,
                    listing,
                    ledgered,
                }),
                Err(reason) => {
                    plan.refused.push(format!("{}: {name}: {reason}", upstream.name));
                }
            }
        }
    }
    plan
}

/// Whether a tool is ledgered: the configuration decides; without a word from it, a
/// tool annotated read-only passes through and every other is ledgered.
fn is_ledgered(tool: &Value, policy: &ToolPolicy) -> bool {
    match policy.policy {
        Some(Policy::Ledgered) => true,
        Some(Policy::Passthrough) => false,
        None => tool.pointer("/annotations/readOnlyHint") != Some(&Value::Bool(true)),
    }
}

fn expose(
    upstream: &str,
    exposed: &str,
    tool: &Value,
    policy: &ToolPolicy,
) -> Result<(Value, Option<Ledgered>), String> {
    let mut listing = tool.as_object().cloned().unwrap_or_default();
    listing.insert("name".to_owned(), Value::String(exposed.to_owned()));
    if !is_ledgered(tool, policy) {
        return Ok((Value::Object(listing), None));
    }
    let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
    let input = policy
        .input_schema
        .clone()
        .or_else(|| tool.get("inputSchema").cloned())
        .ok_or("lists no input schema")?;
    let output = policy.output_schema.clone().or_else(|| tool.get("outputSchema").cloned());
    // The upstream's own key argument: named by the configuration, or one it calls
    // `idempotency_key` itself. It receives the request ref, never the model's key.
    let key_argument = policy.key_argument.clone().or_else(|| {
        input.pointer(&format!("/properties/{KEY_ARGUMENT}")).map(|_| KEY_ARGUMENT.to_owned())
    });
    let ledger_input = without_property(&normalized(&input), key_argument.as_deref());
    let description = tool.get("description").and_then(Value::as_str).unwrap_or(name);
    let mut document = json!({
        "name": ledger_name(upstream, name),
        "description": cut(description, DESCRIPTION_MAX),
        "input_schema": ledger_input,
        "output_schema": recorded_output(output.as_ref().map(normalized)),
    });
    if let (Some(attempts), Some(members)) = (policy.max_attempts, document.as_object_mut()) {
        members.insert("max_attempts".to_owned(), json!(attempts));
    }
    if let (Some(approval), Some(members)) = (&policy.approval, document.as_object_mut()) {
        members.insert(
            "approval".to_owned(),
            json!({"required": true, "max_validity_seconds": approval.validity_seconds}),
        );
    }
    let definition = ToolDefinition::from_document(exposed, &document)
        .map_err(|refusal| format!("the ledger cannot hold it: {refusal}"))?;
    listing.insert("inputSchema".to_owned(), advertised(&input, key_argument.as_deref(), policy));
    if let Some(output) = output {
        listing.insert("outputSchema".to_owned(), output);
    }
    let told = format!(
        "{} [toolledger: give every new action a new `{KEY_ARGUMENT}` and repeat the same \
         one when retrying this action; if the answer is OUTCOME_UNKNOWN, call \
         `{STATUS_TOOL}` with its status_ref, never retry under a new key.]",
        description
    );
    listing.insert("description".to_owned(), Value::String(told));
    Ok((
        Value::Object(listing),
        Some(Ledgered {
            ledger_name: definition.name.clone(),
            spec: definition.tool(),
            key_argument,
            key_from_arguments: policy.key_from_arguments,
            lookup: policy.lookup.clone(),
            approval: policy.approval.clone(),
        }),
    ))
}

/// The ledger's name of an upstream tool, injective by construction: `upstream-tool`
/// when the upstream's name holds no `-` and that is a ledger tool name
/// (`[A-Za-z0-9_-]{1,64}`), so the first `-` splits it into exactly one (upstream, tool);
/// otherwise the upstream's name with each `-` written `_`, then `_h` and 24 hex digits
/// of the SHA-256 of the canonical JSON `[upstream, tool]`: a name with no `-` at all,
/// which no plain name is.
pub(crate) fn ledger_name(upstream: &str, tool: &str) -> String {
    let plain = format!("{upstream}-{tool}");
    let fits = !upstream.contains('-')
        && plain.len() <= 64
        && plain.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-');
    if fits {
        return plain;
    }
    let pair = toolledger_json::canonicalize(&json!([upstream, tool]));
    format!("{}_h{}", upstream.replace('-', "_"), &hex(pair.as_bytes())[..24])
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

fn cut(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default().to_owned()
}

/// A schema from an upstream as the ledger reads it (draft 2020-12): a `$schema` of any
/// JSON Schema draft is dropped, and draft-07's `definitions` become `$defs` (with the
/// `$ref`s that point there), which is all the SDKs' generators write differently.
fn normalized(schema: &Value) -> Value {
    match schema {
        Value::Object(members) => Value::Object(
            members
                .iter()
                .filter(|(key, value)| {
                    !(key.as_str() == "$schema"
                        && value.as_str().is_some_and(|uri| uri.contains("json-schema.org")))
                })
                .map(|(key, value)| {
                    let key = if key == "definitions" { "$defs" } else { key.as_str() };
                    let value = match (key, value) {
                        ("$ref", Value::String(target)) => {
                            Value::String(target.replacen("#/definitions/", "#/$defs/", 1))
                        }
                        _ => normalized(value),
                    };
                    (key.to_owned(), value)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(normalized).collect()),
        other => other.clone(),
    }
}

fn without_property(schema: &Value, property: Option<&str>) -> Value {
    let mut schema = schema.clone();
    if let (Some(property), Some(members)) = (property, schema.as_object_mut()) {
        if let Some(Value::Object(properties)) = members.get_mut("properties") {
            properties.remove(property);
        }
        if let Some(Value::Array(required)) = members.get_mut("required") {
            required.retain(|name| name.as_str() != Some(property));
        }
    }
    schema
}

/// The input schema the host sees: the upstream's, with its own key argument (if any)
/// replaced by the gateway's `idempotency_key`.
fn advertised(input: &Value, key_argument: Option<&str>, policy: &ToolPolicy) -> Value {
    let mut schema = without_property(input, key_argument);
    if let Some(members) = schema.as_object_mut() {
        let properties = members.entry("properties").or_insert_with(|| json!({}));
        if let Some(properties) = properties.as_object_mut() {
            properties.insert(
                KEY_ARGUMENT.to_owned(),
                json!({
                    "type": "string",
                    "pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$",
                    "maxLength": 128,
                    "description": "A key naming this one action: the same key when retrying it, a new key for a new action."
                }),
            );
        }
        if !policy.key_from_arguments {
            let required = members.entry("required").or_insert_with(|| json!([]));
            if let Some(required) = required.as_array_mut() {
                required.push(Value::String(KEY_ARGUMENT.to_owned()));
            }
        }
    }
    schema
}

/// The output the ledger records for a result: `{"content": [...]}`, with the
/// upstream's `structuredContent` beside it when the tool declares an output schema,
/// held to that schema (its internal `$ref`s rebased under `structuredContent`).
fn recorded_output(structured: Option<Value>) -> Value {
    let mut properties = Map::new();
    properties.insert("content".to_owned(), json!({"type": "array"}));
    let mut required = vec![json!("content")];
    if let Some(schema) = structured {
        properties.insert("structuredContent".to_owned(), rebased(&schema));
        required.push(json!("structuredContent"));
    }
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

fn rebased(schema: &Value) -> Value {
    match schema {
        Value::Object(members) => Value::Object(
            members
                .iter()
                .map(|(key, value)| {
                    let value = match (key.as_str(), value) {
                        ("$ref", Value::String(target)) if target.starts_with('#') => {
                            Value::String(format!(
                                "#/properties/structuredContent{}",
                                target.trim_start_matches('#')
                            ))
                        }
                        _ => rebased(value),
                    };
                    (key.clone(), value)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(rebased).collect()),
        other => other.clone(),
    }
}

/// The ledger's output for a result the upstream returned: `content` and, when the
/// tool declares an output schema, `structuredContent`.
pub(crate) fn recorded(result: &Value, structured: bool) -> Value {
    let mut output = Map::new();
    output.insert("content".to_owned(), result.get("content").cloned().unwrap_or(json!([])));
    if structured {
        output.insert(
            "structuredContent".to_owned(),
            result.get("structuredContent").cloned().unwrap_or(Value::Null),
        );
    }
    Value::Object(output)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_or_dotted_name_is_hashed_into_the_ledger_name() {
        assert_eq!(ledger_name("pay", "create_payment"), "pay-create_payment");
        let dotted = ledger_name("pay", "payments.create");
        assert!(dotted.starts_with("pay_h") && dotted.len() == 29, "{dotted}");
        assert_ne!(dotted, ledger_name("pay", "payments.refund"));
        let long = ledger_name("an-upstream_of_32_bytes_exactly_", &"t".repeat(200));
        assert!(long.len() <= 64 && !long.contains('-'), "{long}");
    }

    #[test]
    fn ledger_names_never_collide() {
        // Each pair once shared a name.
        assert_ne!(ledger_name("pay", "ments-go"), ledger_name("pay-ments", "go"));
        let hashed = ledger_name("a", "weird name");
        let literal = hashed.strip_prefix("a_").expect("the hashed form");
        assert_ne!(ledger_name("a", literal), hashed);
        assert_ne!(ledger_name("a", "b_hx"), ledger_name("a-b", "x"));
        // Every name of a small alphabet of upstreams and tools is a different name.
        let parts = ["a", "b", "a-b", "a_b", "h", "x", "b-x", "-", "a.b", "h0123456789abcdef"];
        let mut seen = std::collections::HashMap::new();
        for upstream in parts.iter().filter(|part| crate::config::is_upstream_name(part)) {
            for tool in parts.iter().chain(&[hashed.as_str(), literal]) {
                let name = ledger_name(upstream, tool);
                if let Some(earlier) = seen.insert(name.clone(), (*upstream, *tool)) {
                    panic!("{name} is both {earlier:?} and {:?}", (upstream, tool));
                }
            }
        }
    }

    fn config(upstreams: &[&str]) -> McpConfig {
        let declared: Map<String, Value> = upstreams
            .iter()
            .map(|name| ((*name).to_owned(), json!({"command": ["true"]})))
            .collect();
        let mcp = json!({"tenant": "t", "subject": "s", "upstreams": declared});
        McpConfig::parse("toolledger.toml", std::path::Path::new("."), &mcp)
            .expect("a configuration")
    }

    #[test]
    fn a_table_or_lookup_naming_a_tool_no_upstream_lists_is_refused() {
        let mcp = json!({"tenant": "t", "subject": "s", "upstreams": {"pay": {"command": ["true"],
            "tools": {"charge": {"policy": "ledgered", "lookup": {"tool": "find_chrage",
                "key_argument": "ref"}}, "refnud": {"policy": "ledgered"}}}}});
        let config = McpConfig::parse("toolledger.toml", std::path::Path::new("."), &mcp)
            .expect("a configuration");
        let listing = |names: &[&str]| {
            vec![names.iter().map(|name| json!({"name": name, "inputSchema": {}})).collect()]
        };
        assert_eq!(
            plan(&config, &listing(&["charge", "refund", "find_charge"])).misnamed,
            [
                "at /mcp/upstreams/pay/tools/charge/lookup/tool: upstream pay lists no tool find_chrage",
                "at /mcp/upstreams/pay/tools/refnud: upstream pay lists no tool refnud",
            ]
        );
        assert!(plan(&config, &listing(&["charge", "refnud", "find_chrage"])).misnamed.is_empty());
    }

    fn listed(config: &McpConfig, listings: &[&[&str]]) -> (Vec<(String, usize, String)>, usize) {
        let listings: Vec<Vec<Value>> = listings
            .iter()
            .map(|names| {
                names
                    .iter()
                    .map(|name| json!({"name": name, "inputSchema": {"type": "object"}}))
                    .collect()
            })
            .collect();
        let plan = plan(config, &listings);
        let names =
            plan.tools.iter().map(|t| (t.name.clone(), t.upstream, t.upstream_tool.clone()));
        (names.collect(), plan.refused.len())
    }

    #[test]
    fn listed_names_reach_exactly_one_upstream_tool() {
        let two = config(&["a", "b"]);
        // `b.x` of upstream a, beside upstream b's `x` also listed by a.
        let (names, _) = listed(&two, &[&["b.x", "x"], &["x"]]);
        assert_eq!(
            names,
            [
                ("a.b.x".into(), 0, "b.x".into()),
                ("a.x".into(), 0, "x".into()),
                ("b.x".into(), 1, "x".into())
            ]
        );
        // A name listed twice by one upstream is refused, not listed twice.
        let (names, refused) = listed(&two, &[&["dup", "dup", "ok"], &[]]);
        assert_eq!((names, refused), (vec![("ok".into(), 0, "ok".into())], 2));
        // A dotted name of no upstream's is kept.
        let (names, _) = listed(&two, &[&["c.x"], &[]]);
        assert_eq!(names, [("c.x".into(), 0, "c.x".into())]);
        for config in [two, config(&["pay", "pay-ments"])] {
            let (names, _) = listed(&config, &[&["ments-go", "toolledger_status"], &["go"]]);
            let mut unique: Vec<_> = names.iter().map(|(name, ..)| name.clone()).collect();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), names.len(), "{names:?}");
        }
    }

    #[test]
    fn draft_07_definitions_become_defs_and_refs_follow() {
        let schema = json!({"$schema": "http://json-schema.org/draft-07/schema#",
            "definitions": {"a": {"type": "string"}}, "properties": {"x": {"$ref": "#/definitions/a"}}});
        let read = normalized(&schema);
        assert_eq!(
            read,
            json!({"$defs": {"a": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/a"}}})
        );
        assert_eq!(
            rebased(&read)["properties"]["x"]["$ref"],
            "#/properties/structuredContent/$defs/a"
        );
    }
}
