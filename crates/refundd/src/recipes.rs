//! Tool recipes: the tools the service serves under `/tools/<tool>`, and how each builds
//! its output from a request's key and arguments.
//!
//! A recipe file is a JSON object of tools by name (`[A-Za-z0-9_-]{1,64}`); each recipe
//! is an object with `output` (required, an object) and `resource` (optional, a JSON
//! pointer into the arguments naming the argument that identifies the resource). Inside
//! `output`, an object with exactly the one member `"$id"` (a string prefix) becomes the
//! prefix and the first 32 lowercase hex digits of the SHA-256 of the idempotency key;
//! an object with exactly the one member `"$arg"` (a JSON pointer, RFC 6901) becomes the
//! argument at that pointer, and when the argument is absent the member (or array
//! element) holding it is left out; every other value is literal, objects and arrays
//! recursed into.

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The tools the service serves besides refunds, by name. The default serves none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recipes {
    tools: BTreeMap<String, Recipe>,
}

/// One tool: the argument naming its resource, and its output recipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Recipe {
    resource: Option<String>,
    output: Value,
}

impl Recipes {
    /// Reads the recipes from a JSON object of tools by name.
    ///
    /// # Errors
    ///
    /// One line naming the tool (and where in its recipe) and what is wrong: a name that
    /// is not 1–64 of `A–Z a–z 0–9 _ -`, a recipe that is not an object, a member other
    /// than `resource` and `output`, no `output` or one that is not an object, a
    /// `resource` that is not a JSON pointer to an argument, a `$id` that is not a
    /// string, a `$arg` that is not a JSON pointer.
    pub fn from_json(value: &Value) -> Result<Recipes, String> {
        let Some(tools) = value.as_object() else {
            return Err("the recipes must be a JSON object of tools by name".to_owned());
        };
        let mut recipes = BTreeMap::new();
        for (name, recipe) in tools {
            if !is_tool_name(name) {
                return Err(format!(
                    "tool {}: a tool's name is 1 to 64 of A-Z, a-z, 0-9, _ and -",
                    quoted(name)
                ));
            }
            let recipe =
                Recipe::from_json(recipe).map_err(|why| format!("tool {}: {why}", quoted(name)))?;
            recipes.insert(name.clone(), recipe);
        }
        Ok(Recipes { tools: recipes })
    }

    /// The names of the tools served, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// The recipe of `tool`, if it is served.
    pub(crate) fn get(&self, tool: &str) -> Option<&Recipe> {
        self.tools.get(tool)
    }
}

impl Recipe {
    fn from_json(value: &Value) -> Result<Recipe, String> {
        let Some(members) = value.as_object() else {
            return Err(
                "a recipe must be an object with \"output\" and optionally \"resource\"".to_owned()
            );
        };
        let mut recipe = Recipe { resource: None, output: Value::Null };
        for (name, member) in members {
            match name.as_str() {
                "resource" => {
                    let pointer = member.as_str().ok_or_else(|| {
                        "\"resource\" must be a JSON pointer to an argument, such as \"/order_id\""
                            .to_owned()
                    })?;
                    if pointer.is_empty() {
                        return Err("\"resource\" must name an argument, not the whole arguments \
                                    (a pointer such as \"/order_id\")"
                            .to_owned());
                    }
                    pointer_problem(pointer).map_or(Ok(()), |why| {
                        Err(format!("\"resource\" {}: {why}", quoted(pointer)))
                    })?;
                    recipe.resource = Some(pointer.to_owned());
                }
                "output" => {
                    if !member.is_object() || directive(member).is_some() {
                        return Err(
                            "\"output\" must be an object of the output's members".to_owned()
                        );
                    }
                    check_output(member, &mut String::from("/output"))?;
                    recipe.output = member.clone();
                }
                other => {
                    return Err(format!(
                        "unknown member {} (a recipe has \"resource\" and \"output\")",
                        quoted(other)
                    ));
                }
            }
        }
        if recipe.output.is_null() {
            return Err("\"output\" is missing".to_owned());
        }
        Ok(recipe)
    }

    /// The text of the argument naming the resource: a string as it is, an integer as its
    /// decimal text; none when the recipe names no resource or the argument is absent or
    /// of another kind.
    pub(crate) fn resource(&self, arguments: &Value) -> Option<String> {
        let argument = arguments.pointer(self.resource.as_deref()?)?;
        match argument {
            Value::String(text) => Some(text.clone()),
            Value::Number(number) if number.is_i64() || number.is_u64() => Some(number.to_string()),
            _ => None,
        }
    }

    /// Whether the recipe names a resource at all.
    pub(crate) fn has_resource(&self) -> bool {
        self.resource.is_some()
    }

    /// The output of a request under `key` with `arguments`.
    pub(crate) fn output(&self, key: &str, arguments: &Value) -> Value {
        let id = crate::hex(&Sha256::digest(key.as_bytes()));
        build(&self.output, id.get(..32).unwrap_or(&id), arguments).unwrap_or(Value::Null)
    }
}

/// A directive: an object with exactly the one member `$id` or `$arg`.
fn directive(value: &Value) -> Option<(&str, &Value)> {
    let members = value.as_object()?;
    if members.len() != 1 {
        return None;
    }
    members
        .iter()
        .next()
        .filter(|(name, _)| *name == "$id" || *name == "$arg")
        .map(|(n, v)| (n.as_str(), v))
}

/// Checks the directives of an output recipe; `at` is where `value` is, as a JSON pointer
/// into the tool's recipe.
fn check_output(value: &Value, at: &mut String) -> Result<(), String> {
    match directive(value) {
        Some(("$id", prefix)) => {
            if !prefix.is_string() {
                return Err(format!(
                    "at {}: \"$id\" must be a string (the id's prefix)",
                    quoted(at)
                ));
            }
        }
        Some((_, pointer)) => {
            let Some(pointer) = pointer.as_str() else {
                return Err(format!(
                    "at {}: \"$arg\" must be a JSON pointer into the arguments, such as \"/to\"",
                    quoted(at)
                ));
            };
            if let Some(why) = pointer_problem(pointer) {
                return Err(format!("at {}: \"$arg\" {}: {why}", quoted(at), quoted(pointer)));
            }
        }
        None => match value {
            Value::Object(members) => {
                for (name, member) in members {
                    let len = at.len();
                    at.push('/');
                    at.push_str(&name.replace('~', "~0").replace('/', "~1"));
                    check_output(member, at)?;
                    at.truncate(len);
                }
            }
            Value::Array(items) => {
                for (index, item) in items.iter().enumerate() {
                    let len = at.len();
                    at.push('/');
                    at.push_str(&index.to_string());
                    check_output(item, at)?;
                    at.truncate(len);
                }
            }
            _ => {}
        },
    }
    Ok(())
}

/// The value `recipe` builds; none for a `$arg` whose argument is absent.
fn build(recipe: &Value, id: &str, arguments: &Value) -> Option<Value> {
    match directive(recipe) {
        Some(("$id", prefix)) => {
            Some(Value::String(format!("{}{id}", prefix.as_str().unwrap_or(""))))
        }
        Some((_, pointer)) => arguments.pointer(pointer.as_str().unwrap_or("")).cloned(),
        None => match recipe {
            Value::Object(members) => Some(Value::Object(
                members
                    .iter()
                    .filter_map(|(name, member)| {
                        build(member, id, arguments).map(|built| (name.clone(), built))
                    })
                    .collect::<Map<String, Value>>(),
            )),
            Value::Array(items) => Some(Value::Array(
                items.iter().filter_map(|item| build(item, id, arguments)).collect(),
            )),
            literal => Some(literal.clone()),
        },
    }
}

/// Why `pointer` is not a JSON pointer (RFC 6901), if it is not.
fn pointer_problem(pointer: &str) -> Option<&'static str> {
    if !pointer.is_empty() && !pointer.starts_with('/') {
        return Some("a JSON pointer is empty or starts with /");
    }
    let mut chars = pointer.chars();
    while let Some(char) = chars.next() {
        if char == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Some("in a JSON pointer, ~ is followed by 0 or 1");
        }
    }
    None
}

/// Whether `name` is a tool's name: 1 to 64 of `A-Z a-z 0-9 _ -`.
fn is_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
}

/// `text` as a JSON string: quoted, every control character escaped (one line).
fn quoted(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}
