//! The tidy check: the crate graph of `ARCHITECTURE.md`, read from `cargo metadata`,
//! and a doc example on every public item of the facade (a host reads those first).
//!
//! The workspace's crates form a graph of allowed edges: each crate names the
//! workspace crates it may depend on (for builds, and a few more for tests only), and
//! any other edge is a violation. The store's boundary (`store`) holds no database
//! driver (it renders its SQL per dialect); the engine depends on it alone, and each
//! backend (`store-sqlite`) depends on it, never on another backend. A crate may use external crates only from its allowance: SQLite
//! only in `store-sqlite` (and the benches' and tests' raw baselines), clap only in
//! `cli`. The reference service `refundd` stands apart and depends on none.

use std::{path::Path, process::Command};

use serde_json::Value;

const JSON: &str = "toolledger-json";
const CONTRACT: &str = "toolledger-contract";
const STORE: &str = "toolledger-store";
const SQLITE: &str = "toolledger-store-sqlite";
const POSTGRES: &str = "toolledger-store-postgres";
const DOWNSTREAM: &str = "toolledger-downstream";
const ENGINE: &str = "toolledger-engine";
const HTTP: &str = "toolledger-downstream-http";
const FACADE: &str = "toolledger";
const CLI: &str = "toolledger-cli";
const MCP: &str = "toolledger-mcp";
const PYTHON: &str = "toolledger-python";
const TESTKIT: &str = "toolledger-testkit";
const OTLP: &str = "toolledger-otlp";

/// Each crate of the design and the workspace crates it may depend on.
const GRAPH: [(&str, &[&str]); 17] = [
    (JSON, &[]),
    (CONTRACT, &[JSON]),
    (STORE, &[JSON, CONTRACT]),
    (SQLITE, &[JSON, CONTRACT, STORE]),
    (POSTGRES, &[JSON, CONTRACT, STORE]),
    // The downstream seam alone: a downstream compiles without the flows that call it.
    (DOWNSTREAM, &[CONTRACT, STORE]),
    (ENGINE, &[JSON, CONTRACT, STORE, DOWNSTREAM]),
    // The engine and every store, tested together (unpublished).
    ("toolledger-conformance", &[JSON, CONTRACT, STORE, SQLITE, POSTGRES, ENGINE, TESTKIT]),
    (HTTP, &[JSON, CONTRACT, DOWNSTREAM]),
    (FACADE, &[JSON, CONTRACT, STORE, SQLITE, POSTGRES, DOWNSTREAM, ENGINE, HTTP]),
    // The MCP gateway is a frontend: it reaches the ledger through the facade alone.
    (MCP, &[JSON, FACADE]),
    // The exporters of the processes that own their configuration; no ledger crate.
    (OTLP, &[]),
    // The Python package's binding is a frontend too (unpublished on crates.io).
    (PYTHON, &[JSON, FACADE, OTLP]),
    // The command line reaches the flows through the facade alone, never the engine.
    (CLI, &[JSON, CONTRACT, STORE, POSTGRES, FACADE, MCP, OTLP]),
    (
        "toolledger-bench",
        &[JSON, CONTRACT, STORE, SQLITE, POSTGRES, ENGINE, HTTP, FACADE, CLI, MCP, TESTKIT],
    ),
    // The reference service is somebody else's code.
    ("toolledger-refundd", &[]),
    // What tests and benches share (a throwaway PostgreSQL cluster, a temporary
    // directory, a spawned server's address, a case's intent), kept out of the
    // published crates.
    (TESTKIT, &[JSON, CONTRACT, STORE]),
];

/// Workspace crates a crate may add for tests only: the command line's end-to-end tests
/// make their PostgreSQL ledgers with the conformance suite's backends; the facade's
/// tests run tools from definitions against the reference service, served in a thread;
/// PostgreSQL's tests write the stand-in's receipts through the engine's
/// `StandInReceipts`; the test kit anywhere a test needs it.
const DEV_GRAPH: [(&str, &[&str]); 4] = [
    (CLI, &["toolledger-conformance", TESTKIT]),
    (FACADE, &["toolledger-refundd", TESTKIT]),
    (POSTGRES, &[TESTKIT, ENGINE]),
    ("toolledger-refundd", &[TESTKIT]),
];

/// External crates each crate may use in `[dependencies]`.
fn allowed_external(krate: &str) -> &'static [&'static str] {
    const BASE: &[&str] = &["serde", "serde_json", "sha2", "thiserror", "jiff"];
    match krate {
        // serde for the canonical serializer (`to_string` of any `Serialize`).
        "toolledger-json" => &["serde", "serde_json", "thiserror"],
        // jsonschema and toml for tool definitions: JSON Schema draft 2020-12, read from
        // TOML or JSON.
        "toolledger-contract" => {
            &["serde", "serde_json", "sha2", "thiserror", "jiff", "jsonschema", "toml"]
        }
        "toolledger-store" | "toolledger-engine" => BASE,
        // libc for opening a file a user names without blocking (a FIFO).
        // tokio: the async call paths (`spawn_blocking`) and `OnRuntime`'s runtime handle.
        // opentelemetry: the API alone, for the spans of the `otel` feature.
        "toolledger" => {
            &["serde", "serde_json", "sha2", "thiserror", "jiff", "libc", "tokio", "opentelemetry"]
        }
        "toolledger-downstream" => &["serde_json", "thiserror"],
        "toolledger-store-sqlite" => {
            &["serde", "serde_json", "sha2", "thiserror", "jiff", "rusqlite"]
        }
        "toolledger-store-postgres" => &[
            "serde_json",
            "thiserror",
            "postgres",
            "tokio-postgres",
            "tokio",
            "futures-core",
            "bytes",
        ],
        "toolledger-conformance" => &["serde_json", "rusqlite", "postgres"],
        // opentelemetry: the API alone, for `traceparent` on each request (feature `otel`).
        "toolledger-downstream-http" => {
            &["serde", "serde_json", "sha2", "thiserror", "jiff", "ureq", "opentelemetry"]
        }
        "toolledger-refundd" => &["serde_json", "sha2", "rusqlite", "tiny_http"],
        // rmcp, the official MCP SDK, on tokio; hyper serves its HTTP service and carries
        // its client's requests to an HTTP upstream (SSE parsed by rmcp's own parser).
        "toolledger-mcp" => &[
            "serde",
            "serde_json",
            "sha2",
            "tokio",
            "rmcp",
            "hyper",
            "hyper-util",
            "tower-service",
            "http-body-util",
            "bytes",
            "tokio-util",
            "futures-core",
            "sse-stream",
        ],
        // PyO3, the Rust–Python bridge.
        "toolledger-python" => &["serde_json", "pyo3"],
        "toolledger-testkit" => &["postgres", "tempfile"],
        // `nix`: getrusage for CPU per operation, without unsafe code.
        // opentelemetry and its SDK: the report's traces rows (the bench's `otel` feature).
        "toolledger-bench" => &[
            "serde_json",
            "rusqlite",
            "postgres",
            "ureq",
            "tempfile",
            "rmcp",
            "tokio",
            "nix",
            "opentelemetry",
            "opentelemetry_sdk",
        ],
        // hyper on tokio for the dashboard's and the relay's metrics listener (the crates
        // the gateway already brings), never a listener of its own.
        "toolledger-cli" => &[
            "serde",
            "serde_json",
            "sha2",
            "thiserror",
            "jiff",
            "clap",
            "clap_complete",
            "signal-hook",
            "libc",
            "tokio",
            "hyper",
            "hyper-util",
            "http-body-util",
            "bytes",
        ],
        // The exporters of the command and the Python package: the OpenTelemetry SDK and
        // its OTLP/HTTP exporter, whose HTTP client is ureq behind the exporter's trait.
        "toolledger-otlp" => &[
            "opentelemetry",
            "opentelemetry_sdk",
            "opentelemetry-otlp",
            "opentelemetry-http",
            "async-trait",
            "http",
            "ureq",
            "bytes",
        ],
        _ => &[],
    }
}

/// External crates a crate may add for tests only: proptest and tempfile anywhere;
/// rusqlite in the crates above the store, whose tests tamper with rows through a raw
/// connection; tokio in the facade, whose async-host example and test run on it, and
/// the OpenTelemetry SDK, whose in-memory exporter its span tests read; snapbox in the
/// command line, whose tests check the documentation's examples.
fn dev_only(krate: &str) -> &'static [&'static str] {
    match krate {
        "toolledger-cli" => &["proptest", "tempfile", "rusqlite", "ureq", "snapbox"],
        "toolledger" => &["proptest", "tempfile", "rusqlite", "tokio", "opentelemetry_sdk"],
        "toolledger-refundd" => &["tempfile", "ureq"],
        _ => &["proptest", "tempfile"],
    }
}

pub(crate) fn check(root: &Path) -> Result<String, String> {
    let metadata = workspace_metadata(root)?;
    let (crates, mut violations) = violations(&metadata);
    let facade = root.join("crates/toolledger/src");
    let mut files: Vec<_> = std::fs::read_dir(&facade)
        .map_err(|err| format!("could not list the facade's sources: {err}"))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .collect();
    files.sort();
    for file in &files {
        let source = std::fs::read_to_string(file)
            .map_err(|err| format!("could not read {}: {err}", file.display()))?;
        let name = file.file_name().map(|name| name.to_string_lossy()).unwrap_or_default();
        violations.extend(
            without_example(&source)
                .into_iter()
                .map(|item| format!("toolledger/src/{name}: `{item}` has no doc example")),
        );
    }
    if violations.is_empty() {
        Ok(format!("{crates} crates, every edge allowed; every facade item has a doc example"))
    } else {
        for violation in &violations {
            println!("tidy: {violation}");
        }
        Err(format!("{} tidy violations", violations.len()))
    }
}

/// `cargo metadata --no-deps`: the workspace's own packages and their manifests.
pub(crate) fn workspace_metadata(root: &Path) -> Result<Value, String> {
    let output = Command::new("cargo")
        .current_dir(root)
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
        .output()
        .map_err(|err| format!("could not run cargo metadata: {err}"))?;
    if !output.status.success() {
        return Err("cargo metadata failed".to_owned());
    }
    serde_json::from_slice(&output.stdout)
        .map_err(|err| format!("cargo metadata printed something unreadable: {err}"))
}

/// Every breach of the crate graph in `metadata` (the output of `cargo metadata
/// --no-deps`), and how many workspace crates were checked.
pub(crate) fn violations(metadata: &Value) -> (usize, Vec<String>) {
    let mut found = Vec::new();
    let packages = metadata["packages"].as_array().map(Vec::as_slice).unwrap_or_default();
    let mut checked = 0;
    for package in packages {
        let name = package["name"].as_str().unwrap_or_default();
        if name == "xtask" {
            continue;
        }
        checked += 1;
        let Some((_, allowed)) = GRAPH.iter().find(|(krate, _)| *krate == name) else {
            found.push(format!("{name} is not a crate of the design (ARCHITECTURE.md)"));
            continue;
        };
        let for_tests = DEV_GRAPH
            .iter()
            .find(|(krate, _)| *krate == name)
            .map_or(&[][..], |(_, crates)| *crates);
        let dependencies =
            package["dependencies"].as_array().map(Vec::as_slice).unwrap_or_default();
        for dependency in dependencies {
            let dep = dependency["name"].as_str().unwrap_or_default();
            let dev = dependency["kind"].as_str() == Some("dev");
            if GRAPH.iter().any(|(krate, _)| *krate == dep) {
                if !(allowed.contains(&dep) || (dev && for_tests.contains(&dep))) {
                    found.push(format!("{name} depends on {dep}: not an edge of the design"));
                }
            } else if dep == "xtask" || dep.starts_with("toolledger") {
                found.push(format!("{name} depends on {dep}, which is not a crate of the design"));
            } else if !(allowed_external(name).contains(&dep)
                || (dev && dev_only(name).contains(&dep)))
            {
                found
                    .push(format!("{name} depends on external crate {dep}, outside its allowance"));
            }
        }
    }
    (checked, found)
}

/// The public items of `source` (functions, types, traits, constants; not re-exports,
/// fields or variants) whose doc comment has no code block, unless `#[doc(hidden)]`.
pub(crate) fn without_example(source: &str) -> Vec<String> {
    const KINDS: [&str; 7] = ["fn ", "struct ", "enum ", "trait ", "type ", "const ", "static "];
    let lines: Vec<&str> = source.lines().map(str::trim_start).collect();
    let mut found = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let Some(rest) = line.strip_prefix("pub ") else { continue };
        let rest = rest.strip_prefix("async ").unwrap_or(rest);
        let Some(kind) = KINDS.iter().find(|kind| rest.starts_with(**kind)) else { continue };
        let above = lines[..index]
            .iter()
            .rev()
            .take_while(|line| line.starts_with("///") || line.starts_with("#["));
        let (mut example, mut hidden) = (false, false);
        for line in above {
            example |= line.starts_with("///") && line.contains("```");
            hidden |= line.starts_with("#[doc(hidden)]");
        }
        if !example && !hidden {
            let name: String = rest[kind.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.push(name);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{violations, without_example};

    #[test]
    fn a_public_item_without_a_doc_example_is_named() {
        let source = "/// Has one.\n///\n/// ```\n/// let x = 1;\n/// ```\n#[derive(Debug)]\npub struct Good;\n\
            /// Says only words.\npub fn bad() {}\n\
            impl Good {\n    /// Nothing runs.\n    #[must_use]\n    pub async fn worse(&self) {}\n}\n\
            #[doc(hidden)]\npub fn hidden() {}\n\
            pub(crate) fn inner() {}\npub use std::fmt;\n";
        assert_eq!(without_example(source), ["bad", "worse"]);
    }

    fn metadata(packages: serde_json::Value) -> serde_json::Value {
        json!({ "packages": packages })
    }

    #[test]
    fn allowed_edges_pass() {
        let good = metadata(json!([
            {"name": "toolledger-json", "dependencies": [{"name": "serde_json", "kind": null}, {"name": "proptest", "kind": "dev"}]},
            {"name": "toolledger-contract", "dependencies": [{"name": "toolledger-json", "kind": null}, {"name": "sha2", "kind": null}]},
            {"name": "toolledger-store", "dependencies": [{"name": "toolledger-contract", "kind": null}]},
            {"name": "toolledger-store-sqlite", "dependencies": [{"name": "toolledger-store", "kind": null}, {"name": "rusqlite", "kind": null}]},
            {"name": "toolledger-engine", "dependencies": [{"name": "toolledger-store", "kind": null}, {"name": "proptest", "kind": "dev"}]},
            {"name": "xtask", "dependencies": [{"name": "anything", "kind": null}]},
        ]));
        assert_eq!(violations(&good), (5, vec![]));
    }

    #[test]
    fn upward_edges_foreign_crates_and_misplaced_externals_are_caught() {
        let bad = metadata(json!([
            {"name": "toolledger-json", "dependencies": [{"name": "toolledger-contract", "kind": "dev"}]},
            {"name": "toolledger-engine", "dependencies": [{"name": "rusqlite", "kind": null}, {"name": "toolledger-engine", "kind": null}]},
            {"name": "toolledger-contract", "dependencies": [{"name": "proptest", "kind": null}, {"name": "xtask", "kind": null}]},
            {"name": "toolledger-store", "dependencies": [{"name": "rusqlite", "kind": null}]},
            {"name": "toolledger-engine", "dependencies": [{"name": "toolledger-store-sqlite", "kind": null}]},
            {"name": "toolledger-store-sqlite", "dependencies": [{"name": "toolledger-store-postgres", "kind": "dev"}]},
            {"name": "toolledger-extra", "dependencies": []},
        ]));
        let (checked, found) = violations(&bad);
        assert_eq!(checked, 7);
        assert_eq!(
            found,
            [
                "toolledger-json depends on toolledger-contract: not an edge of the design",
                "toolledger-engine depends on external crate rusqlite, outside its allowance",
                "toolledger-engine depends on toolledger-engine: not an edge of the design",
                "toolledger-contract depends on external crate proptest, outside its allowance",
                "toolledger-contract depends on xtask, which is not a crate of the design",
                "toolledger-store depends on external crate rusqlite, outside its allowance",
                "toolledger-engine depends on toolledger-store-sqlite: not an edge of the design",
                "toolledger-store-sqlite depends on toolledger-store-postgres: not an edge of the design",
                "toolledger-extra is not a crate of the design (ARCHITECTURE.md)",
            ]
        );
    }
}
