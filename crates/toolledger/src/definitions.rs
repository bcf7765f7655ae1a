//! Reading tool definitions from files (`docs/tools.md`).

use std::{io::Read, path::Path};

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
    let bytes = read_bounded(path).map_err(|kind| Error::invalid(format!("{file}: {kind}")))?;
    let document = parse_document(&file, &bytes).map_err(definition_error)?;
    ToolDefinition::from_document(&file, &document).map_err(definition_error)
}

pub(crate) fn definition_error(err: toolledger_contract::DefinitionError) -> Error {
    Error::caused(ErrorCode::UsageError, err)
}

/// The file's bytes, at most one more than the bound (so an over-long file is refused by
/// the parser, which says how long it is).
pub(crate) fn read_bounded(path: &Path) -> Result<Vec<u8>, &'static str> {
    let file = std::fs::File::open(path).map_err(|err| match err.kind() {
        std::io::ErrorKind::NotFound => "no such file",
        std::io::ErrorKind::PermissionDenied => "permission denied",
        _ => "cannot be opened",
    })?;
    if !file.metadata().map_err(|_| "cannot be read")?.is_file() {
        return Err("not a regular file");
    }
    let mut bytes = Vec::new();
    let limit = u64::try_from(DEFINITION_BYTES_MAX).unwrap_or(u64::MAX).saturating_add(1);
    file.take(limit).read_to_end(&mut bytes).map_err(|_| "cannot be read")?;
    Ok(bytes)
}
