//! Reading tool definitions from files (`docs/tools.md`).

use std::path::Path;

use toolledger_contract::{DEFINITION_BYTES_MAX, ErrorCode, ToolDefinition, parse_document};

use crate::Error;

/// Reads the tool definition at `path` (TOML, or JSON when the name ends in `.json`):
/// at most 1 MiB, every schema checked and compiled, nothing fetched.
///
/// # Errors
///
/// `USAGE_ERROR` naming the file, a JSON pointer into the definition and the reason; a
/// file that cannot be read names the file and the kind of failure only.
///
/// # Example
///
/// ```
/// # let dir = std::env::temp_dir().join(format!("toolledger-doc-tool-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// # let path = dir.join("open_ticket.toml");
/// std::fs::write(&path, r#"
/// name = "open_ticket"
/// description = "Open a support ticket in one of the caller's queues."
/// [input_schema]
/// type = "object"
/// required = ["queue", "summary"]
/// additionalProperties = false
/// properties = { queue = { type = "string" }, summary = { type = "string", maxLength = 200 } }
/// [output_schema]
/// type = "object"
/// required = ["ticket_id", "queue"]
/// properties = { ticket_id = { type = "string" }, queue = { type = "string" } }
/// [output_bindings]
/// "/queue" = "/queue"
/// "#)?;
/// let tool = toolledger::load_tool(&path)?.tool();
/// assert_eq!(tool.name, "open_ticket");
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn load_tool(path: &Path) -> Result<ToolDefinition, Error> {
    let file = path.display().to_string();
    let bytes = read_file(&file, path, DEFINITION_BYTES_MAX)?;
    let document = parse_document(&file, &bytes).map_err(definition_error)?;
    ToolDefinition::from_document(&file, &document).map_err(definition_error)
}

pub(crate) fn definition_error(err: toolledger_contract::DefinitionError) -> Error {
    Error::caused(ErrorCode::UsageError, err)
}

/// A configuration's or a definition's bytes, or the `USAGE_ERROR` naming `file` and why.
pub(crate) fn read_file(file: &str, path: &Path, limit: usize) -> Result<Vec<u8>, Error> {
    crate::read_bounded(path, limit)
        .map_err(|why| Error::invalid(format!("{file} {}", why.reason())))
}
