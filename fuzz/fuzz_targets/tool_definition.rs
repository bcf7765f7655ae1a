//! Tool definitions (`parse_document`, `ToolDefinition::from_document`) on arbitrary
//! bytes, read as TOML and as JSON.
//!
//! Never a panic, and nothing fetched; for any definition it accepts:
//!
//! - its schemas are object schemas, within the size bound;
//! - the tool builds, and validating values against its schemas (the definition's own
//!   examples: the empty object, the schema documents themselves) answers, never panics;
//! - the definition depends on the value alone: its canonical JSON form reads back to
//!   the same definition.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use toolledger_contract::{SCHEMA_BYTES_MAX, ToolDefinition, parse_document};
use toolledger_json::canonicalize;

fuzz_target!(|data: &[u8]| {
    for file in ["fuzz.toml", "fuzz.json"] {
        let Ok(document) = parse_document(file, data) else { continue };
        let Ok(definition) = ToolDefinition::from_document(file, &document) else { continue };
        for schema in [&definition.input, &definition.output] {
            assert_eq!(schema.document()["type"], "object");
            assert!(canonicalize(schema.document()).len() <= SCHEMA_BYTES_MAX);
        }
        let tool = definition.tool();
        for value in [json!({}), definition.input.document().clone(), Value::Null] {
            let _ = tool.input.validate(&value, None);
            let _ = tool.output.validate(&value, Some(&value));
        }
        let canonical = canonicalize(&document);
        let again = parse_document("again.json", canonical.as_bytes())
            .and_then(|value| ToolDefinition::from_document("again.json", &value));
        assert_eq!(again.ok(), Some(definition), "the canonical form reads differently");
    }
});
