//! Tool definitions: the shipped `refund_order` is today's tool byte for byte, and every
//! kind of bad definition is refused with the file, a pointer and a reason.

use proptest::prelude::*;
use serde_json::{Value, json};
use toolledger_contract::{
    JsonSchema, REFUND_ORDER_DEFINITION, RefundOrder, Schema, SchemaError, ToolDefinition,
    parse_document,
};

fn definition(
    file: &str,
    text: &str,
) -> Result<ToolDefinition, toolledger_contract::DefinitionError> {
    let document = parse_document(file, text.as_bytes())?;
    ToolDefinition::from_document(file, &document)
}

/// A minimal valid definition, as JSON, for the bad ones to start from.
fn base() -> Value {
    json!({
        "name": "send_invoice_email",
        "description": "Email an invoice to its customer.",
        "input_schema": {
            "type": "object",
            "properties": {"invoice_id": {"type": "string"}, "to": {"type": "string", "format": "email"}},
            "required": ["invoice_id", "to"],
            "additionalProperties": false
        },
        "output_schema": {
            "type": "object",
            "properties": {"message_id": {"type": "string"}, "invoice_id": {"type": "string"}},
            "required": ["message_id", "invoice_id"]
        },
        "output_bindings": {"/invoice_id": "/invoice_id"}
    })
}

fn refused_with(document: &Value) -> toolledger_contract::DefinitionError {
    let text = serde_json::to_string(document).unwrap();
    definition("tool.json", &text).unwrap_err()
}

#[test]
fn the_shipped_refund_definition_is_todays_tool() {
    let defined = RefundOrder::default().tool();
    let coded = RefundOrder::default().code_defined();
    assert!(matches!(defined.input, Schema::Json { .. }), "the definition, not the fallback");
    assert_eq!(defined.revisions, coded.revisions);
    assert_eq!(defined.name, coded.name);
    assert_eq!(defined.max_attempts, coded.max_attempts);
    // The same arguments pass and fail both.
    let good = json!({"order_id": "ord_1001", "amount_minor": 1299, "currency": "USD", "reason": "damaged"});
    assert!(defined.input.validate(&good, None).is_ok());
    assert!(coded.input.validate(&good, None).is_ok());
    for entry in std::fs::read_dir(crate::workspace("fixtures/input-invalid")).unwrap() {
        let path = entry.unwrap().path();
        let case: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let Some(arguments) = case.pointer("/proposal/arguments") else { continue };
        if case.pointer("/proposal/tool_name") != Some(&json!("refund_order")) {
            continue;
        }
        assert_eq!(
            defined.input.validate(arguments, None).is_ok(),
            coded.input.validate(arguments, None).is_ok(),
            "{}",
            path.display()
        );
        assert!(defined.input.validate(arguments, None).is_err(), "{}", path.display());
    }
    // Outputs: the receipt the service gives passes; each broken member fails both.
    let output = json!({"refund_id": format!("rf_{}", "a".repeat(32)), "order_id": "ord_1001",
        "amount_minor": 1299, "currency": "USD", "status": "refunded"});
    assert!(defined.output.validate(&output, Some(&good)).is_ok());
    assert!(coded.output.validate(&output, Some(&good)).is_ok());
    for (pointer, value) in [
        ("/refund_id", json!("rf_short")),
        ("/order_id", json!("ord_other")),
        ("/amount_minor", json!(1300)),
        ("/status", json!("pending")),
    ] {
        let mut broken = output.clone();
        *broken.pointer_mut(pointer).unwrap() = value;
        assert!(defined.output.validate(&broken, Some(&good)).is_err(), "{pointer}");
        assert!(coded.output.validate(&broken, Some(&good)).is_err(), "{pointer}");
    }
    let mut extra = output.clone();
    extra["note"] = json!("x");
    assert!(defined.output.validate(&extra, Some(&good)).is_err());
    // A binding broken is told apart from a schema broken.
    let mut unbound = output;
    unbound["currency"] = json!("EUR");
    assert!(defined.output.validate(&unbound, Some(&good)).unwrap_err().is_binding());
    assert!(REFUND_ORDER_DEFINITION.contains("refund_order.input.v2"));
}

#[test]
fn a_rejection_names_the_pointer_and_the_keyword_never_the_value() {
    let tool = definition("tool.json", &base().to_string()).unwrap().tool();
    let refused = tool.input.validate(&json!({"invoice_id": "inv-1", "to": "secret-text"}), None);
    let SchemaError::Rejected(rejection) = refused.unwrap_err() else { panic!("a rejection") };
    assert_eq!((rejection.pointer.as_str(), rejection.keyword.as_str()), ("/to", "format"));
    let missing = tool.input.validate(&json!({"invoice_id": "inv-1"}), None).unwrap_err();
    assert_eq!(missing.rejection().unwrap().keyword, "required");
    assert!(!missing.to_string().contains("inv-1"));
}

#[test]
fn derived_revisions_change_with_the_schema_they_cover() {
    let first = definition("tool.json", &base().to_string()).unwrap();
    let mut changed = base();
    changed["input_schema"]["properties"]["to"]["maxLength"] = json!(200);
    let second = definition("tool.json", &changed.to_string()).unwrap();
    assert_ne!(first.revisions.input, second.revisions.input);
    assert_eq!(first.revisions.output, second.revisions.output);
    assert_eq!(first.revisions.policy, second.revisions.policy);
    let mut described = base();
    described["description"] = json!("Another description.");
    let third = definition("tool.json", &described.to_string()).unwrap();
    assert_eq!(first.revisions, third.revisions, "a description is not a contract");
}

#[test]
fn toml_and_json_definitions_of_one_tool_are_one_contract() {
    let toml = r#"
name = "send_invoice_email"
description = "Email an invoice to its customer."
[input_schema]
type = "object"
required = ["invoice_id", "to"]
additionalProperties = false
properties = { invoice_id = { type = "string" }, to = { type = "string", format = "email" } }
[output_schema]
type = "object"
required = ["message_id", "invoice_id"]
properties = { message_id = { type = "string" }, invoice_id = { type = "string" } }
[output_bindings]
"/invoice_id" = "/invoice_id"
"#;
    let from_toml = definition("tool.toml", toml).unwrap();
    let from_json = definition("tool.json", &base().to_string()).unwrap();
    assert_eq!(from_toml, from_json);
}

/// A dozen kinds of bad definition, each refused naming where and why.
#[test]
fn bad_definitions_are_refused_with_the_file_the_pointer_and_the_reason() {
    let with = |pointer: &str, value: Value| {
        let mut document = base();
        let (parent, member) = pointer.rsplit_once('/').unwrap();
        document.pointer_mut(parent).unwrap()[member] = value;
        document
    };
    let big = Value::Array((0..700_000).map(|_| json!("0123456789abc")).collect());
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "a remote $ref",
            with("/input_schema/properties/to", json!({"$ref": "https://example.com/email.json"})),
            "/input_schema/properties/to/$ref",
            "remote",
        ),
        ("a 10 MB schema", with("/input_schema/enum", big), "", "bound"),
        (
            "a $ref cycle",
            with(
                "/input_schema/$defs",
                json!({"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}),
            ),
            "/input_schema/$defs/",
            "cycle",
        ),
        (
            "an unknown policy member",
            with("/approval", json!({"required": true, "quorum": 2})),
            "/approval/quorum",
            "unknown member",
        ),
        ("an unknown top member", with("/timeout", json!(3)), "/timeout", "unknown member"),
        (
            "an unsupported keyword",
            with("/input_schema/properties/to/requried", json!(true)),
            "/input_schema/properties/to/requried",
            "unsupported keyword",
        ),
        (
            "an unsupported format",
            with("/input_schema/properties/to/format", json!("idn-email")),
            "/input_schema/properties/to/format",
            "unsupported format",
        ),
        (
            "a schema that is not an object schema",
            with("/output_schema/type", json!("array")),
            "/output_schema/type",
            "object",
        ),
        (
            "another draft",
            with("/input_schema/$schema", json!("http://json-schema.org/draft-07/schema#")),
            "/input_schema/$schema",
            "2020-12",
        ),
        (
            "a dangling $ref",
            with("/input_schema/properties/to", json!({"$ref": "#/$defs/missing"})),
            "/input_schema/properties/to/$ref",
            "names nothing",
        ),
        (
            "a pattern that does not compile",
            with("/input_schema/properties/to/pattern", json!("(?<=a)b")),
            "/input_schema",
            "does not compile",
        ),
        (
            "a binding that is not a pointer",
            with("/output_bindings", json!({"invoice_id": "/invoice_id"})),
            "/output_bindings/invoice_id",
            "pointer",
        ),
        (
            "a precondition over an optional member",
            with("/precondition", json!("/invoices/{cc}/sendable")),
            "/precondition",
            "declares and requires",
        ),
        ("a bad tool name", with("/name", json!("send invoice")), "/name", "tool name"),
        (
            "no output schema",
            {
                let mut document = base();
                document.as_object_mut().unwrap().remove("output_schema");
                document
            },
            "/output_schema",
            "required",
        ),
        ("attempts out of range", with("/max_attempts", json!(0)), "/max_attempts", "1 to 100"),
        (
            "approver roles without an approval",
            with("/approval", json!({"approver_roles": ["finance"]})),
            "/approval",
            "required = true",
        ),
        (
            "an owner that is not a pointer",
            with("/authorization", json!({"owner": "customer_id"})),
            "/authorization/owner",
            "pointer",
        ),
    ];
    for (kind, document, pointer, reason) in cases {
        let refused = refused_with(&document);
        assert_eq!(refused.file, "tool.json", "{kind}");
        assert!(refused.pointer.starts_with(pointer), "{kind}: {refused}");
        assert!(refused.reason.contains(reason), "{kind}: {refused}");
    }
    // Malformed documents: a duplicate JSON member, a TOML date, bytes over the bound.
    let duplicate = definition("tool.json", r#"{"name": "a", "name": "b"}"#).unwrap_err();
    assert!(duplicate.reason.contains("strict JSON"), "{duplicate}");
    let date = definition("tool.toml", "name = \"a\"\nwhen = 2026-12-01\n").unwrap_err();
    assert!(date.reason.contains("date"), "{date}");
    assert_eq!(date.pointer, "/when");
    let huge = " ".repeat(toolledger_contract::DEFINITION_BYTES_MAX + 1);
    assert!(definition("tool.toml", &huge).unwrap_err().reason.contains("bound"));
    let toml_error = definition("tool.toml", "name = \n").unwrap_err();
    assert!(toml_error.reason.contains("line 1"), "{toml_error}");
}

#[test]
fn a_schema_of_too_many_refs_is_refused_before_its_refs_are_followed() {
    let properties: serde_json::Map<String, Value> =
        (0..300).map(|n| (format!("p{n}"), json!({"$ref": "#/$defs/text"}))).collect();
    let many =
        json!({"type": "object", "$defs": {"text": {"type": "string"}}, "properties": properties});
    assert!(JsonSchema::compile(many).unwrap_err().reason.contains("$refs"));
}

#[test]
fn recursion_through_properties_is_a_cycle_too() {
    let tree = json!({"type": "object", "$defs": {"node": {"type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "properties": {"root": {"$ref": "#/$defs/node"}}});
    assert!(JsonSchema::compile(tree).unwrap_err().reason.contains("cycle"));
    let shared = json!({"type": "object", "$defs": {"email": {"type": "string", "format": "email"}},
        "properties": {"to": {"$ref": "#/$defs/email"}, "cc": {"type": "array", "items": {"$ref": "#/$defs/email"}}}});
    assert!(JsonSchema::compile(shared).is_ok(), "one definition used twice is no cycle");
}

proptest! {
    /// The definition and the code-defined table agree on every argument object built
    /// from the refund's members and some near misses.
    #[test]
    fn the_refund_definition_and_the_table_agree(
        order_id in "[A-Za-z0-9_-]{0,66}|[a-z ]{1,5}",
        amount in prop_oneof![Just(json!(0)), Just(json!(1)), Just(json!(100_000_001)), (1i64..100_000_000).prop_map(|n| json!(n)), Just(json!(true)), Just(json!("12"))],
        currency in "[A-Z]{2,4}|[a-z]{3}",
        reason in prop_oneof![Just("damaged"), Just("duplicate"), Just("other")],
        extra in proptest::option::of("[a-z]{1,3}"),
    ) {
        let mut arguments = json!({"order_id": order_id, "amount_minor": amount, "currency": currency, "reason": reason});
        if let Some(extra) = extra {
            arguments[format!("x{extra}")] = json!(1);
        }
        let defined = RefundOrder::default().tool();
        let coded = RefundOrder::default().code_defined();
        prop_assert_eq!(
            defined.input.validate(&arguments, None).is_ok(),
            coded.input.validate(&arguments, None).is_ok()
        );
    }
}

/// Found by the fuzz target `tool_definition`: a definition is the value its canonical
/// form denotes, so reading that form back gives the same definition (and the derived
/// revisions cover exactly what is enforced).
#[test]
fn a_definition_is_the_value_its_canonical_form_denotes() {
    let with = |schema_extra: &str, downstream: &str| {
        format!(
            r#"{{"name":"t","description":"d","input_schema":{{"type":"object"{schema_extra}}},"output_schema":{{"type":"object"}}{downstream}}}"#
        )
    };
    let same = [
        (with(r#","maxProperties":2.0"#, ""), with(r#","maxProperties":2"#, "")),
        (with(r#","minimum":-0.0"#, ""), with(r#","minimum":0"#, "")),
        (with(r#","const":9007199254740992.0"#, ""), with(r#","const":9007199254740992"#, "")),
        (with(r#","maximum":1e300"#, ""), with(r#","maximum":1E+300"#, "")),
        (with("", r#","downstream":{"retries":1.0}"#), with("", r#","downstream":{"retries":1}"#)),
    ];
    for (float, integer) in same {
        let (float, integer) =
            (definition("a.json", &float).unwrap(), definition("b.json", &integer).unwrap());
        assert_eq!(float, integer);
        assert_eq!(float.revisions, integer.revisions);
    }
    let toml = "name = \"t\"\ndescription = \"d\"\n[input_schema]\ntype = \"object\"\n\
                maxProperties = 2.0\n[output_schema]\ntype = \"object\"\n";
    let document = parse_document("a.toml", toml.as_bytes()).unwrap();
    let read = ToolDefinition::from_document("a.toml", &document).unwrap();
    let canonical = toolledger_json::canonicalize(&document);
    assert_eq!(definition("again.json", &canonical).unwrap(), read);

    // Beyond 2^53 the canonical form is a double's shortest digits, another integer:
    // 2^53 + 1 would be written 9007199254740992, 80143298509481984 as ...980.
    for beyond in ["9007199254740993", "80143298509481984", "80143298509481986.0"] {
        let text = with(&format!(r#","const":{beyond}"#), "");
        let refused = definition("c.json", &text).unwrap_err();
        assert_eq!(refused.pointer, "/input_schema/const");
        assert!(refused.reason.contains("beyond ±2^53"), "{}", refused.reason);
    }
    let schema =
        JsonSchema::compile(json!({"type": "object", "maximum": -9_007_199_254_740_993_i64}));
    assert_eq!(schema.unwrap_err().pointer, "/maximum");
}
