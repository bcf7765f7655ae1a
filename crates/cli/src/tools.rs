//! `toolledger tools check|list`: the declared tools, checked and shown.

use serde_json::{Value, json};
use toolledger::{ApprovalValidAt, Config, Declared, Setting};
use toolledger_json::canonicalize;

use crate::{
    args::ToolsAction,
    run::{Failure, Printed},
};

pub(crate) fn run(action: &ToolsAction) -> Result<Printed, Failure> {
    match action {
        ToolsAction::Check { config, .. } => {
            let Some(config) = Config::discover(config.as_deref())? else {
                return Err(Failure {
                    code: "USAGE_ERROR",
                    message: format!(
                        "no configuration: give --config PATH, set {}, or put {} in the \
                         working directory",
                        toolledger::CONFIG_ENV,
                        toolledger::CONFIG_FILE
                    ),
                });
            };
            // Every schema compiled, every route and service checked by the load; the
            // tools are built once more as a command would build them, preconditions
            // included, when their variables are set.
            let environment = environment(&config);
            if environment.iter().all(|(_, set)| *set) {
                config.tool_specs()?;
            }
            let package = json!({
                "gate": "PASS",
                "code": "OK",
                "config": config.file(),
                "tools": config.tools().iter().map(|tool| tool.definition.name.as_str()).collect::<Vec<_>>(),
                "environment": environment
                    .iter()
                    .map(|(variable, set)| json!({"variable": variable, "set": set}))
                    .collect::<Vec<_>>(),
            });
            Ok(Printed::Package(package, true))
        }
        ToolsAction::List { config } => {
            let rows = rows(Config::discover(config.as_deref())?.as_ref());
            let lines: String = rows.iter().map(|row| format!("{}\n", canonicalize(row))).collect();
            Ok(Printed::Text(lines))
        }
    }
}

/// One JSON object per declared tool; without a configuration, the built-in refund tool.
pub(crate) fn rows(config: Option<&Config>) -> Vec<Value> {
    match config {
        Some(config) => config.tools().iter().map(|tool| shown(config, tool)).collect(),
        None => {
            let builtin = toolledger::RefundOrder::default().tool();
            vec![json!({
                "name": builtin.name,
                "description": builtin.description,
                "source": "refund_order (built in)",
                "revisions": builtin.revisions.to_json(),
                "downstream": Value::Null,
            })]
        }
    }
}

/// Every environment variable the configuration reads, and whether it is set (never its
/// value).
fn environment(config: &Config) -> Vec<(String, bool)> {
    let mut variables = Vec::new();
    for service in config.services().values() {
        if let Setting::Env(variable) = &service.base_url {
            variables.push(variable.clone());
        }
        variables.extend(service.headers_from_env.iter().map(|(_, variable)| variable.clone()));
    }
    variables.sort();
    variables.dedup();
    variables
        .into_iter()
        .map(|variable| {
            let set = std::env::var_os(&variable).is_some_and(|value| !value.is_empty());
            (variable, set)
        })
        .collect()
}

fn shown(config: &Config, tool: &Declared) -> Value {
    let definition = &tool.definition;
    let downstream = tool.route.as_ref().map(|route| {
        let service = config.services().get(&route.service);
        json!({
            "service": route.service,
            "identity": service.map(|service| service.identity.to_string()),
            "execute": route.execute,
            "lookup": route.lookup,
        })
    });
    json!({
        "name": definition.name,
        "description": definition.description,
        "source": tool.source,
        "revisions": definition.revisions.to_json(),
        "approval": {
            "required": definition.approval.required || tool.builtin,
            "approver_roles": definition.approval.approver_roles,
            "max_validity_seconds": definition.approval.max_validity_seconds,
            "valid_at": match definition.approval.valid_at {
                ApprovalValidAt::Acceptance => "acceptance",
                ApprovalValidAt::Effect => "effect",
            },
        },
        "authorization": {
            "owner": definition.authorization.owner,
            "act_for_others": definition.authorization.act_for_others,
        },
        "precondition": definition.precondition,
        "max_attempts": definition.max_attempts,
        "downstream": downstream,
    })
}
