//! JSON Schema (draft 2020-12) for tool definitions: what a schema may say, checked when
//! it is loaded, and what a value that fails it is told.
//!
//! Validation is the `jsonschema` crate's, compiled offline: no retriever is built in, so
//! a `$ref` reaches only the schema itself. Before compiling, [`JsonSchema::compile`]
//! walks the document and refuses what the ledger cannot keep its promises with: a
//! keyword it does not know (a misspelled `requried` would otherwise be ignored
//! silently), a remote `$ref`, a `$ref` cycle, a format it cannot assert, a document
//! over [`SCHEMA_BYTES_MAX`] or deeper than [`SCHEMA_DEPTH_MAX`].

use std::{collections::BTreeSet, fmt, sync::Arc};

use jsonschema::{Draft, PatternOptions, Validator};
use serde_json::Value;

/// The largest schema document, in canonical bytes.
pub const SCHEMA_BYTES_MAX: usize = 256 * 1024;

/// The deepest schema document (the outermost object is depth 1).
pub const SCHEMA_DEPTH_MAX: usize = 32;

/// The most `$ref`s one schema holds (the cycle check looks at every pair).
const REFS_MAX: usize = 256;

/// The only `$schema` a definition may name.
pub const DRAFT_2020_12: &str = "https://json-schema.org/draft/2020-12/schema";

/// The formats a schema may require: those the validator asserts without a network or
/// an internationalization table.
const FORMATS: [&str; 13] = [
    "date",
    "date-time",
    "time",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "uuid",
    "regex",
    "json-pointer",
];

/// What a member of a schema object holds.
#[derive(Clone, Copy)]
enum Holds {
    /// A subschema.
    Schema,
    /// An array of subschemas.
    Schemas,
    /// An object whose every member is a subschema.
    SchemaMap,
    /// A value the walk does not enter (`enum`, `const`, `default`, a number, …).
    Value,
}

/// Every keyword of draft 2020-12 a definition may use, and what it holds. Left out on
/// purpose: `$id`, `$anchor`, `$dynamicRef`, `$dynamicAnchor`, `$vocabulary` (they move
/// the base URI or resolve at run time), and the pre-2020 `definitions`, `dependencies`
/// and array-form `items`.
fn keyword(name: &str) -> Option<Holds> {
    Some(match name {
        "allOf" | "anyOf" | "oneOf" | "prefixItems" => Holds::Schemas,
        "not"
        | "if"
        | "then"
        | "else"
        | "items"
        | "contains"
        | "additionalProperties"
        | "propertyNames"
        | "unevaluatedItems"
        | "unevaluatedProperties"
        | "contentSchema" => Holds::Schema,
        "$defs" | "properties" | "patternProperties" | "dependentSchemas" => Holds::SchemaMap,
        "$schema" | "$ref" | "$comment" | "type" | "enum" | "const" | "multipleOf" | "maximum"
        | "exclusiveMaximum" | "minimum" | "exclusiveMinimum" | "maxLength" | "minLength"
        | "pattern" | "maxItems" | "minItems" | "uniqueItems" | "maxContains" | "minContains"
        | "maxProperties" | "minProperties" | "required" | "dependentRequired" | "format"
        | "title" | "description" | "default" | "deprecated" | "readOnly" | "writeOnly"
        | "examples" | "contentEncoding" | "contentMediaType" => Holds::Value,
        _ => return None,
    })
}

/// Why a schema was refused: where in the schema (a JSON pointer) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaRefusal {
    /// Where, as a JSON pointer into the schema (`""` is the whole schema).
    pub pointer: String,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for SchemaRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.pointer.is_empty() { "the schema" } else { &self.pointer };
        write!(f, "at {at}: {}", self.reason)
    }
}

fn refused(pointer: &str, reason: impl Into<String>) -> SchemaRefusal {
    SchemaRefusal { pointer: pointer.to_owned(), reason: reason.into() }
}

/// Where a value failed a schema: the JSON pointer into the value and the keyword that
/// failed. Never the value itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The JSON pointer into the value (`""` is the whole value).
    pub pointer: String,
    /// The schema keyword that failed (`required`, `format`, `additionalProperties`, …),
    /// or `binding` for an output member not equal to the input member it is bound to.
    pub keyword: String,
}

/// A compiled JSON Schema and the document it was compiled from. Two schemas are equal
/// when their documents are.
#[derive(Clone)]
pub struct JsonSchema {
    document: Arc<Value>,
    validator: Arc<Validator>,
}

impl JsonSchema {
    /// Checks `document` as a draft 2020-12 schema a definition may hold, then compiles
    /// it. The root must be an object schema (`"type": "object"`), as every model
    /// provider's function calling and MCP ask of a tool's schemas.
    ///
    /// # Errors
    ///
    /// A [`SchemaRefusal`] naming the pointer and the reason: an unsupported keyword or
    /// format, a remote or dangling `$ref`, a `$ref` cycle, a document over the size or
    /// depth bound, or one the validator does not compile.
    ///
    /// # Example
    ///
    /// ```
    /// use serde_json::json;
    /// use toolledger_contract::JsonSchema;
    ///
    /// let schema = JsonSchema::compile(json!({
    ///     "type": "object",
    ///     "properties": {"to": {"type": "string", "format": "email"}},
    ///     "required": ["to"],
    /// }))
    /// .unwrap();
    /// assert!(schema.check(&json!({"to": "ada@example.com"})).is_ok());
    /// let rejection = schema.check(&json!({"to": "not an address"})).unwrap_err();
    /// assert_eq!((rejection.pointer.as_str(), rejection.keyword.as_str()), ("/to", "format"));
    ///
    /// let remote = JsonSchema::compile(json!({"type": "object", "$ref": "https://example.com/s.json"}));
    /// assert!(remote.unwrap_err().reason.contains("remote"));
    /// ```
    pub fn compile(document: Value) -> Result<JsonSchema, SchemaRefusal> {
        let document = exact_numbers(&document, "")?;
        let size = toolledger_json::canonicalize(&document).len();
        if size > SCHEMA_BYTES_MAX {
            return Err(refused(
                "",
                format!("the schema is {size} bytes, over the {SCHEMA_BYTES_MAX}-byte bound"),
            ));
        }
        let Some(root) = document.as_object() else {
            return Err(refused("", "a schema must be a JSON object"));
        };
        if root.get("type").and_then(Value::as_str) != Some("object") {
            return Err(refused("/type", "a tool's schema must be \"type\": \"object\""));
        }
        let mut walk = Walk { refs: Vec::new() };
        walk.schema(&document, "", 1)?;
        walk.check_refs(&document)?;
        let validator = jsonschema::options()
            .with_draft(Draft::Draft202012)
            .offline()
            .should_validate_formats(true)
            // Linear-time matching: no backtracking, so no pattern is a denial of service.
            .with_pattern_options(PatternOptions::regex())
            .build(&document)
            .map_err(|err| {
                let pointer = err.instance_path().to_string();
                refused(&pointer, format!("the schema does not compile: {}", err.masked()))
            })?;
        Ok(JsonSchema { document: Arc::new(document), validator: Arc::new(validator) })
    }

    /// The schema document.
    pub fn document(&self) -> &Value {
        &self.document
    }

    /// Checks `value`: the first failure's pointer and keyword.
    ///
    /// # Errors
    ///
    /// The [`Rejection`] of the first failure the validator reports.
    pub fn check(&self, value: &Value) -> Result<(), Rejection> {
        // Valid values are the hot path (every dispatch and replay checks its arguments
        // and output): `is_valid` decides them with no error machinery, a third less
        // work than `validate` on refund_order's arguments; only a value that fails
        // pays a second pass, to be told where.
        if self.validator.is_valid(value) {
            return Ok(());
        }
        match self.validator.validate(value) {
            Ok(()) => Ok(()),
            Err(err) => Err(Rejection {
                pointer: err.instance_path().to_string(),
                keyword: err.kind().keyword().to_owned(),
            }),
        }
    }

    /// Whether `value` passes (faster than [`JsonSchema::check`]: no error is built).
    pub fn accepts(&self, value: &Value) -> bool {
        self.validator.is_valid(value)
    }

    /// Whether `name` is a property the root declares and requires.
    pub(crate) fn requires_property(&self, name: &str) -> bool {
        let declared = self.document.get("properties").and_then(|p| p.get(name)).is_some();
        let required =
            self.document.get("required").and_then(Value::as_array).is_some_and(|required| {
                required.iter().any(|member| member.as_str() == Some(name))
            });
        declared && required
    }
}

impl PartialEq for JsonSchema {
    fn eq(&self, other: &JsonSchema) -> bool {
        self.document == other.document
    }
}

impl fmt::Debug for JsonSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("JsonSchema").field(&self.document).finish()
    }
}

/// The walk over a schema document: every keyword known, every `$ref` collected.
struct Walk {
    /// Each `$ref`: where it is, and the pointer it names.
    refs: Vec<(String, String)>,
}

/// `segment` escaped for a JSON pointer (RFC 6901).
/// `value` with every number as its canonical form (RFC 8785) reads back, so that what a
/// definition enforces is what its digests cover: an integral float is that integer
/// (`2.0` is `2`, as JSON Schema itself says), and an integer beyond ±2^53 is refused,
/// because the canonical form writes such a number as a double's shortest digits
/// (`80143298509481984` becomes `80143298509481980`), which read back as another integer.
pub(crate) fn exact_numbers(value: &Value, at: &str) -> Result<Value, SchemaRefusal> {
    Ok(match value {
        Value::Number(number) => Value::Number(exact_number(number).ok_or_else(|| {
            refused(
                at,
                "an integer beyond ±2^53 (9007199254740992): its canonical form (RFC 8785) \
                 is not that integer",
            )
        })?),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(index, item)| exact_numbers(item, &format!("{at}/{index}")))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(members) => Value::Object(
            members
                .iter()
                .map(|(name, item)| {
                    exact_numbers(item, &format!("{at}/{}", escape(name)))
                        .map(|item| (name.clone(), item))
                })
                .collect::<Result<_, _>>()?,
        ),
        other => other.clone(),
    })
}

/// The number its canonical form reads back as, or `None` for one whose canonical form
/// reads back as another number.
fn exact_number(number: &serde_json::Number) -> Option<serde_json::Number> {
    // 2^53, 2^64 and -2^63, exact as doubles. Beyond the last two a canonical integer
    // does not fit an integer and is read back as the same double.
    const EXACT: u64 = 1 << 53;
    const U64_END: f64 = 18_446_744_073_709_551_616.0;
    const I64_MIN: f64 = -9_223_372_036_854_775_808.0;
    if let Some(unsigned) = number.as_u64() {
        return (unsigned <= EXACT).then(|| number.clone());
    }
    if let Some(signed) = number.as_i64() {
        return (signed.unsigned_abs() <= EXACT).then(|| number.clone());
    }
    let double = number.as_f64()?;
    if double.fract() != 0.0 || !(I64_MIN..U64_END).contains(&double) {
        return Some(number.clone());
    }
    // Integral and within ±2^53: `as` converts it exactly.
    (double.abs() <= EXACT as f64).then(|| {
        if double >= 0.0 {
            serde_json::Number::from(double as u64)
        } else {
            serde_json::Number::from(double as i64)
        }
    })
}

fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

impl Walk {
    fn schema(&mut self, schema: &Value, at: &str, depth: usize) -> Result<(), SchemaRefusal> {
        if depth > SCHEMA_DEPTH_MAX {
            return Err(refused(at, format!("the schema nests deeper than {SCHEMA_DEPTH_MAX}")));
        }
        let members = match schema {
            Value::Bool(_) => return Ok(()),
            Value::Object(members) => members,
            _ => return Err(refused(at, "a schema must be an object or a boolean")),
        };
        for (name, member) in members {
            let here = format!("{at}/{}", escape(name));
            let Some(holds) = keyword(name) else {
                return Err(refused(&here, format!("unsupported keyword {name:?}")));
            };
            self.member(name, member, &here, holds, depth)?;
        }
        Ok(())
    }

    fn member(
        &mut self,
        name: &str,
        member: &Value,
        here: &str,
        holds: Holds,
        depth: usize,
    ) -> Result<(), SchemaRefusal> {
        match (name, holds) {
            ("$schema", _) if member.as_str() != Some(DRAFT_2020_12) => {
                return Err(refused(here, format!("only draft 2020-12 ({DRAFT_2020_12})")));
            }
            ("$ref", _) => {
                let Some(target) = member.as_str() else {
                    return Err(refused(here, "$ref must be a string"));
                };
                let Some(pointer) = target.strip_prefix('#') else {
                    return Err(refused(
                        here,
                        "a remote $ref: only references inside the schema (\"#…\") are \
                         allowed, and nothing is fetched",
                    ));
                };
                if !(pointer.is_empty() || pointer.starts_with('/')) {
                    return Err(refused(here, "$ref must be \"#\" or a JSON pointer \"#/…\""));
                }
                if self.refs.len() == REFS_MAX {
                    return Err(refused(here, format!("more than {REFS_MAX} $refs in one schema")));
                }
                self.refs.push((here.to_owned(), pointer.to_owned()));
            }
            ("format", _) => {
                let known = member.as_str().is_some_and(|format| FORMATS.contains(&format));
                if !known {
                    return Err(refused(
                        here,
                        format!("unsupported format; supported: {}", FORMATS.join(", ")),
                    ));
                }
            }
            (_, Holds::Schema) => self.schema(member, here, depth + 1)?,
            (_, Holds::Schemas) => {
                let Some(items) = member.as_array() else {
                    return Err(refused(here, format!("{name} must be an array of schemas")));
                };
                for (index, item) in items.iter().enumerate() {
                    self.schema(item, &format!("{here}/{index}"), depth + 1)?;
                }
            }
            (_, Holds::SchemaMap) => {
                let Some(map) = member.as_object() else {
                    return Err(refused(here, format!("{name} must be an object of schemas")));
                };
                for (key, item) in map {
                    self.schema(item, &format!("{here}/{}", escape(key)), depth + 1)?;
                }
            }
            (_, Holds::Value) => {}
        }
        Ok(())
    }

    /// Every `$ref` names a schema inside the document, and no chain of `$ref`s leads
    /// back into a schema it started from: a tool's arguments are bounded data, and a
    /// cycle would be resolved forever or not at all.
    fn check_refs(&self, document: &Value) -> Result<(), SchemaRefusal> {
        for (at, target) in &self.refs {
            if document.pointer(target).is_none() {
                return Err(refused(at, format!("$ref names nothing in the schema: #{target}")));
            }
        }
        // Edges: from a referenced location to every reference inside it.
        let targets: BTreeSet<&str> = self.refs.iter().map(|(_, target)| target.as_str()).collect();
        let inside = |location: &str| -> Vec<&str> {
            self.refs
                .iter()
                .filter(|(at, _)| is_within(at, location))
                .map(|(_, target)| target.as_str())
                .collect()
        };
        for start in &targets {
            let mut stack: Vec<&str> = inside(start);
            let mut seen: BTreeSet<&str> = BTreeSet::new();
            while let Some(next) = stack.pop() {
                if next == *start {
                    let at = self
                        .refs
                        .iter()
                        .find(|(_, target)| target == start)
                        .map_or(String::new(), |(at, _)| at.clone());
                    return Err(refused(&at, format!("a $ref cycle through #{start}")));
                }
                if seen.insert(next) {
                    stack.extend(inside(next));
                }
            }
        }
        Ok(())
    }
}

/// Whether the location `at` (a pointer) lies within the schema at `location`.
fn is_within(at: &str, location: &str) -> bool {
    location.is_empty()
        || at == location
        || at.strip_prefix(location).is_some_and(|rest| rest.starts_with('/'))
}

/// Whether `pointer` is a JSON pointer (RFC 6901): empty, or `/`-led with `~` escapes
/// only as `~0` and `~1`.
pub(crate) fn is_pointer(pointer: &str) -> bool {
    (pointer.is_empty() || pointer.starts_with('/'))
        && pointer.len() <= 512
        && pointer.split('~').skip(1).all(|rest| rest.starts_with('0') || rest.starts_with('1'))
}
