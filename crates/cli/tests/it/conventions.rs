//! The conventions a person expects of a command line: help, suggestions, options a
//! command does not take refused, commands that only read never creating a store,
//! errors that say why without saying where, and shell completions.

use std::process::Command;

use serde_json::Value;

use crate::Dir;

/// The JSON error on the last line of stderr: its code and message.
fn last_error(stderr: &str) -> (String, String) {
    let line = stderr.lines().last().unwrap_or_default();
    let value: Value = serde_json::from_str(line).unwrap();
    let text = |name: &str| value["error"][name].as_str().unwrap().to_owned();
    (text("code"), text("message"))
}

#[test]
fn bare_toolledger_shows_help_and_help_command_shows_each_commands_help() {
    let dir = Dir::new();
    let bare = dir.run(&[]);
    assert_eq!(bare.code, 2, "{bare:?}");
    assert_eq!(bare.stdout, "");
    assert!(bare.stderr.contains("Usage: toolledger <COMMAND>"), "{}", bare.stderr);
    assert!(bare.stderr.contains("Exit codes:"), "{}", bare.stderr);
    let (code, message) = last_error(&bare.stderr);
    assert_eq!(code, "USAGE_ERROR");
    assert!(message.starts_with("missing command: one of dispatch, "), "{message}");

    let help = dir.run(&["help"]);
    assert_eq!((help.code, help.stderr.as_str()), (0, ""), "{help:?}");
    assert!(help.stdout.contains("Usage: toolledger <COMMAND>"), "{}", help.stdout);
    for command in ["dispatch", "relay", "list", "completions", "help"] {
        assert!(help.stdout.contains(&format!("\n  {command} ")), "{command}: {}", help.stdout);
    }

    let dispatch = dir.run(&["help", "dispatch"]);
    assert_eq!(dispatch.code, 0, "{dispatch:?}");
    assert!(dispatch.stdout.contains("Usage: toolledger dispatch [OPTIONS]"));
    assert_eq!(dispatch.stdout, dir.run(&["dispatch", "--help"]).stdout);

    let unknown = dir.run(&["help", "dispach"]);
    unknown.assert_error("USAGE_ERROR");
    assert!(!dir.join("toolledger.sqlite3").exists());
}

#[test]
fn each_commands_help_lists_only_the_options_it_takes() {
    let dir = Dir::new();
    let help = |command: &str| dir.run(&[command, "--help"]).stdout;
    let options = |text: &str| -> Vec<String> {
        text.lines()
            .map(|line| {
                let line = line.trim_start();
                // `-h, --help`: the long name.
                if line.starts_with('-') && !line.starts_with("--") {
                    line.get(4..).unwrap_or("")
                } else {
                    line
                }
            })
            .filter_map(|line| line.strip_prefix("--"))
            .map(|rest| rest.split([' ', ',']).next().unwrap_or_default().to_owned())
            .collect()
    };
    for (command, takes, refuses) in [
        (
            "dispatch",
            &["db", "busy-timeout-ms", "store-clock", "case", "claims", "pretty"][..],
            &[][..],
        ),
        ("relay", &["db", "case", "claims", "pretty", "once"], &[]),
        ("audit", &["db", "busy-timeout-ms", "pretty"], &["case", "claims", "store-clock"]),
        ("list", &["db", "state"], &["case", "pretty", "store-clock"]),
        ("metrics", &["db"], &["case", "pretty"]),
        ("demo", &[], &["db", "case", "pretty", "busy-timeout-ms"]),
    ] {
        let listed = options(&help(command));
        for name in takes {
            assert!(listed.iter().any(|option| option == name), "{command} --{name}: {listed:?}");
        }
        for name in refuses {
            assert!(!listed.iter().any(|option| option == name), "{command} --{name}: {listed:?}");
        }
    }
    // The shared options are not listed before the command.
    let top = options(&dir.run(&["--help"]).stdout);
    assert_eq!(top, ["help", "version"], "{top:?}");
}

#[test]
fn unknown_commands_and_options_keep_clap_s_suggestion_and_never_echo_input() {
    let dir = Dir::new();
    for (args, message) in [
        (&["dispach"][..], "unknown command; did you mean 'dispatch'?"),
        (&["statsu", "--status-ref", "sr_x"], "unknown command; did you mean 'status'?"),
        (&["dispatch", "--dbb", "x.sqlite3"], "unknown option --dbb; did you mean '--db'?"),
        (
            &["dispatch", "--fixtur", "case.json"],
            "unknown option --fixtur; did you mean '--fixture'?",
        ),
        (&["list", "--stat", "dead"], "unknown option --stat; did you mean '--state'?"),
        (&["frobnicate-the-ledger"], "unknown command"),
    ] {
        let run = dir.run(args);
        run.assert_error("USAGE_ERROR");
        assert_eq!(last_error(&run.stderr).1, message, "{args:?}");
    }
    assert!(!dir.join("toolledger.sqlite3").exists());
}

#[test]
fn shared_options_go_after_the_command_or_before_it_but_never_where_unused_or_twice() {
    let dir = Dir::new();
    let after = dir.run(&["dispatch", "--db", "a.sqlite3", "--case", "case.json"]);
    assert_eq!(after.text("/delivery"), "fresh", "{after:?}");
    // As versions before 0.2 wrote them; `--fixture` is the case file's former name.
    let before = dir.run(&["--db", "a.sqlite3", "--fixture", "case.json", "dispatch"]);
    assert_eq!(before.text("/delivery"), "local_replay", "{before:?}");
    let pretty = dir.run(&["--db", "a.sqlite3", "audit", "--pretty"]);
    assert_eq!(pretty.code, 0, "{pretty:?}");
    assert!(pretty.stdout.starts_with("{\n  \""), "{}", pretty.stdout);

    for (args, message) in [
        (&["--db", "x.sqlite3", "demo"][..], "demo does not take --db"),
        (&["--case", "case.json", "audit"], "audit does not take --case"),
        (&["--pretty", "list"], "list does not take --pretty"),
        (&["--store-clock", "caller", "metrics"], "metrics does not take --store-clock"),
        (&["demo", "--db", "x.sqlite3"], "unknown option --db"),
        (&["audit", "--case", "case.json"], "unknown option --case"),
        (
            &["--db", "x.sqlite3", "dispatch", "--db", "y.sqlite3", "--case", "case.json"],
            "--db is given both before and after the command",
        ),
        (&["--pretty", "audit", "--pretty"], "--pretty is given both before and after the command"),
    ] {
        let run = dir.run(args);
        run.assert_error("USAGE_ERROR");
        assert_eq!(last_error(&run.stderr).1, message, "{args:?}");
    }
    assert!(!dir.join("x.sqlite3").exists() && !dir.join("y.sqlite3").exists());
}

#[test]
fn commands_that_only_read_never_create_a_store() {
    let dir = Dir::new();
    let sr = "sr_0123456789abcdef0123456789abcdef";
    for args in [
        &["status", "--case", "case.json", "--status-ref", sr][..],
        &["process", "--case", "case.json", "--status-ref", sr],
        &["audit"],
        &["list"],
        &["show", "--status-ref", sr],
        &["metrics"],
        &["requeue", "--status-ref", sr, "--reason", "back"],
        &["gc", "--older-than-days", "1"],
    ] {
        let mut with_db = args.to_vec();
        with_db.extend(["--db", "absent.sqlite3"]);
        let run = dir.run(&with_db);
        run.assert_error("STORE_NOT_FOUND");
        assert!(!dir.join("absent.sqlite3").exists(), "{args:?} created the store");
    }
    // The default location too.
    dir.run(&["status", "--case", "case.json", "--status-ref", sr]).assert_error("STORE_NOT_FOUND");
    assert!(!dir.join("toolledger.sqlite3").exists());
}

#[test]
fn file_errors_give_the_reason_class_and_now_is_blamed_on_now() {
    let dir = Dir::new();
    let message = |args: &[&str], code: &str| {
        let run = dir.run(args);
        run.assert_error(code);
        last_error(&run.stderr).1
    };
    assert_eq!(
        message(&["dispatch", "--case", "missing.json"], "FIXTURE_IO_ERROR"),
        "the case file was not found"
    );
    std::fs::create_dir(dir.join("folder.json")).unwrap();
    assert_eq!(
        message(&["dispatch", "--case", "folder.json"], "FIXTURE_IO_ERROR"),
        "the case file is not a regular file"
    );
    assert_eq!(
        message(&["dispatch", "--case", "case.json", "--claims", "nope.json"], "CLAIMS_IO_ERROR"),
        "the claims file was not found"
    );
    for now in ["99999999999999", "253402297200", "-1"] {
        assert_eq!(
            message(&["dispatch", "--case", "case.json", "--now", now], "USAGE_ERROR"),
            "invalid value for --now: outside the timestamp range 0..=253402297199 (1970 to \
             9999, less the longest lease)",
            "{now}"
        );
    }
    assert_eq!(
        message(&["dispatch", "--case", "case.json", "--now", "+5"], "USAGE_ERROR"),
        "invalid value for --now: not a canonical integer"
    );
    let edge = dir.run(&["dispatch", "--case", "case.json", "--now", "253402297199"]);
    assert_ne!(edge.code, 2, "the last instant --now may name: {edge:?}");
}

#[test]
fn completions_for_every_shell_name_every_command() {
    let dir = Dir::new();
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let run = dir.run(&["completions", shell]);
        assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{shell}: {run:?}");
        for command in ["dispatch", "status", "relay", "requeue", "completions"] {
            assert!(run.stdout.contains(command), "{shell} lacks {command}");
        }
        if shell == "bash" {
            dir.write("toolledger.bash", run.stdout.as_bytes());
            let syntax = Command::new("bash").arg("-n").arg(dir.join("toolledger.bash")).output();
            assert!(syntax.unwrap().status.success(), "bash cannot parse the script");
        }
    }
    dir.run(&["completions", "tcsh"]).assert_error("USAGE_ERROR");
    dir.run(&["completions"]).assert_error("USAGE_ERROR");
}

#[test]
fn the_example_claims_file_grants_what_the_readme_says() {
    let dir = Dir::new();
    dir.write_case("agent.json", |case| case["principal"]["subject_id"] = Value::from("agent-7"));
    let claims = crate::workspace("fixtures/claims.json");
    let claims = claims.to_str().unwrap();
    // Without the file nobody holds a role, and agent-7 does not own the order.
    let denied = dir.run(&["dispatch", "--case", "agent.json", "--db", "a.sqlite3"]);
    assert_eq!(denied.text("/code"), "NOT_FOUND", "{denied:?}");
    let granted =
        dir.run(&["dispatch", "--case", "agent.json", "--db", "b.sqlite3", "--claims", claims]);
    assert_eq!(granted.text("/delivery"), "fresh", "{granted:?}");
}
