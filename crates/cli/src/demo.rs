//! `toolledger demo`: the whole story in a fresh temporary directory, narrated for a
//! person. Every step runs a real command (in this process) and checks its answer; the
//! demo exits 0 only if every step behaved as documented.

use std::{ffi::OsString, fmt::Write as _, path::Path};

use serde_json::Value;

use crate::run::{Outcome, error_line, run};

/// The PASS case (`docs/contract.md`), built into the binary so the demo needs no setup.
/// `demo-case.json` is a symbolic link to `fixtures/persistence-case.json`: one file to
/// bless, and `cargo package` stores its contents inside the crate, where a path out of
/// the crate directory would not resolve.
const CASE: &str = include_str!("demo-case.json");

struct Demo<'a> {
    dir: &'a Path,
    out: String,
    failed: Vec<String>,
}

impl Demo<'_> {
    fn say(&mut self, text: &str) {
        let _ = writeln!(self.out, "{text}");
    }

    /// Runs `toolledger <args>` in the demo directory, shows the command and the key
    /// fields of its answer, and checks `expect`.
    fn step(
        &mut self,
        title: &str,
        args: &[&str],
        expect: impl FnOnce(&Outcome, &Value) -> bool,
    ) -> Value {
        let _ = writeln!(self.out, "\n{title}\n  $ toolledger {}", args.join(" "));
        let mut argv: Vec<OsString> = vec!["toolledger".into()];
        for arg in args {
            // File names are relative to the demo directory.
            let arg = if arg.ends_with(".json") || arg.ends_with(".sqlite3") {
                self.dir.join(arg).into_os_string()
            } else {
                OsString::from(arg)
            };
            argv.push(arg);
        }
        let outcome = run(argv);
        let answer = outcome.answer();
        let _ = writeln!(self.out, "  exit {}", outcome.code);
        for (label, pointer) in [
            ("gate", "/gate"),
            ("code", "/code"),
            ("delivery", "/delivery"),
            ("status", "/status"),
            ("status_ref", "/status_ref"),
            ("refund_id", "/result/model_view/refund_id"),
            ("request_sha256", "/result/digests/request_sha256"),
            ("call_binding_sha256", "/result/digests/call_binding_sha256"),
            ("checks", "/checks"),
            ("counts", "/counts"),
            ("unreconciled_downstream_receipts", "/unreconciled_downstream_receipts"),
            ("message", "/message"),
        ] {
            if let Some(value) = answer.pointer(pointer).filter(|value| !value.is_null()) {
                let _ = writeln!(self.out, "  {label:<20} {value}");
            }
        }
        if !outcome.stderr.is_empty() {
            let _ = write!(self.out, "  stderr: {}", outcome.stderr);
        }
        if !expect(&outcome, &answer) {
            self.failed.push(title.to_owned());
            let _ = writeln!(self.out, "  !! this step did not behave as documented");
        }
        answer
    }
}

/// How many downstream receipts an audit answer lists as awaiting reconciliation.
fn unreconciled(answer: &Value) -> Option<usize> {
    answer.pointer("/unreconciled_downstream_receipts").and_then(Value::as_array).map(Vec::len)
}

fn text(answer: &Value, pointer: &str) -> String {
    answer.pointer(pointer).and_then(Value::as_str).unwrap_or_default().to_owned()
}

pub(crate) fn demo() -> Outcome {
    let dir =
        std::env::temp_dir().join(format!("toolledger-demo-{}", crate::clock::unique_suffix()));
    let prepared = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join("case.json"), CASE))
        .and_then(|()| std::fs::write(dir.join("conflict.json"), conflicting_case()));
    if prepared.is_err() {
        return Outcome {
            code: 2,
            stdout: String::new(),
            stderr: format!(
                "{}\n",
                error_line("FIXTURE_IO_ERROR", "the demo could not write its temporary files")
            ),
        };
    }
    let mut demo = Demo { dir: &dir, out: String::new(), failed: Vec::new() };
    story(&mut demo);
    let _ = std::fs::remove_dir_all(&dir);

    if demo.failed.is_empty() {
        demo.say("\nEvery step behaved as documented. The temporary directory was removed.");
        Outcome { code: 0, stdout: demo.out, stderr: String::new() }
    } else {
        let message = format!("{} demo steps did not behave as documented", demo.failed.len());
        Outcome {
            code: 2,
            stdout: demo.out,
            stderr: format!("{}\n", error_line("INTERNAL_ERROR", &message)),
        }
    }
}

/// The PASS case with another amount under the same idempotency key.
fn conflicting_case() -> String {
    let mut case: Value = serde_json::from_str(CASE).unwrap_or(Value::Null);
    if let Some(amount) = case.pointer_mut("/proposal/arguments/amount_minor") {
        *amount = Value::from(1999);
    }
    serde_json::to_string_pretty(&case).unwrap_or_default()
}

fn story(demo: &mut Demo<'_>) {
    demo.say("toolledger demo: one refund, told through every answer toolledger gives.");
    demo.say(&format!("Working in a fresh temporary directory: {}", demo.dir.display()));
    demo.say("The case (case.json) is a model's proposal to refund order ord-1001 for 25.99 USD,");
    demo.say("approved by approver-1, with idempotency key refund-ord-1001-a.");

    let fresh = demo.step(
        "1. Dispatch the refund. The intent and its outbox event commit together (A), a worker\n   claims the lease, the downstream refunds (B), the local receipt is recorded (C).",
        &["dispatch", "--db", "ledger.sqlite3", "--case", "case.json"],
        |outcome, answer| outcome.code == 0 && text(answer, "/delivery") == "fresh",
    );
    demo.step(
        "2. The model retries the same call. Same key, same intent: the ledger replays its receipt.\n   No second refund; the request and result digests are byte-identical.",
        &["dispatch", "--db", "ledger.sqlite3", "--case", "case.json"],
        |outcome, answer| {
            outcome.code == 0
                && text(answer, "/delivery") == "local_replay"
                && text(answer, "/result/digests/request_sha256") == text(&fresh, "/result/digests/request_sha256")
                && text(answer, "/result/digests/result_sha256") == text(&fresh, "/result/digests/result_sha256")
        },
    );
    demo.step(
        "3. The same key with a different amount is not a retry: it is refused.",
        &["dispatch", "--db", "ledger.sqlite3", "--case", "conflict.json"],
        |outcome, answer| outcome.code == 1 && text(answer, "/code") == "IDEMPOTENCY_CONFLICT",
    );
    let unknown = demo.step(
        "4. On a new ledger, the process dies right after the downstream committed (B) and before\n   the local receipt (C). The refund happened; nothing local proves it. toolledger does not guess.",
        &["dispatch", "--db", "crash.sqlite3", "--case", "case.json", "--failure", "after_downstream_commit"],
        |outcome, answer| outcome.code == 1 && text(answer, "/code") == "OUTCOME_UNKNOWN",
    );
    let status_ref = text(&unknown, "/status_ref");
    demo.step(
        "5. Dispatching again does not retry the refund or look for it: still unknown.",
        &["dispatch", "--db", "crash.sqlite3", "--case", "case.json"],
        |outcome, answer| outcome.code == 1 && text(answer, "/code") == "OUTCOME_UNKNOWN",
    );
    demo.step(
        "6. The audit passes and lists the downstream receipt that awaits reconciliation.",
        &["audit", "--db", "crash.sqlite3"],
        |outcome, answer| outcome.code == 0 && unreconciled(answer) == Some(1),
    );
    demo.step(
        "7. An explicit status query, under its own purpose-bound call identity, re-authorizes,\n   checks the receipt against the output contract, and records it (C).",
        &["status", "--db", "crash.sqlite3", "--case", "case.json", "--status-ref", &status_ref],
        |outcome, answer| outcome.code == 0 && text(answer, "/delivery") == "receipt_reconciled",
    );
    demo.step(
        "8. The audit passes with nothing left to reconcile.",
        &["audit", "--db", "crash.sqlite3"],
        |outcome, answer| outcome.code == 0 && unreconciled(answer) == Some(0),
    );
}
