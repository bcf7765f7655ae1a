//! The documentation's command examples, run as a new user would run them.
//!
//! Every ```` ```console ```` block of `README.md` and of `docs/*.md` is a list of steps:
//! a line `$ COMMAND` (continued by lines starting `> `) followed by the output it must
//! print, stdout and stderr together, in order. `[..]` inside a line matches any text
//! and `...` on a line of its own any lines (snapbox's patterns, as trycmd uses them).
//! Each document runs top to bottom in one `bash` with `set -euo pipefail`, so variables
//! carry from one block to the next, a command that exits non-zero without the
//! document saying so (`|| echo "exit $?"`) stops the run, and the transcript must equal
//! the document's.
//!
//! The shell starts clean: an empty directory holding a copy of the case, the claims and
//! the tool files of `fixtures/`, its own
//! `HOME` and `TMPDIR`, and a `PATH` with the binaries this test run built first. The
//! one line not run as written is `cargo build …`: the binaries under test are already
//! built, and building again inside a test would wait on the test's own build lock.
//! `DATABASE_URL` names a fresh database (one per document) of the tests' own PostgreSQL
//! server. After the
//! run, `TMPDIR` must be empty and the directory must hold nothing new: the examples
//! clean up after themselves.
//!
//! A block of another shell language that runs `toolledger` is refused: it could drift.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use crate::{finish, workspace};

/// One example: the command as written, and the output the document shows.
struct Step {
    command: String,
    expected: String,
}

/// The console steps of `markdown`, or why the document cannot be checked.
fn steps(name: &str, markdown: &str) -> Result<Vec<Step>, String> {
    let mut steps: Vec<Step> = Vec::new();
    let mut fence: Option<String> = None;
    for (number, line) in markdown.lines().enumerate() {
        let at = format!("{name}:{}", number + 1);
        if let Some(info) = line.strip_prefix("```") {
            match &fence {
                None => fence = Some(info.trim().to_owned()),
                Some(_) if info.trim().is_empty() => fence = None,
                Some(_) => return Err(format!("{at}: a fence opens inside a fence")),
            }
            continue;
        }
        match fence.as_deref() {
            Some("console") => {
                if let Some(command) = line.strip_prefix("$ ") {
                    steps.push(Step { command: command.to_owned(), expected: String::new() });
                } else if let Some(more) = line.strip_prefix("> ") {
                    let step = steps.last_mut().ok_or(format!("{at}: `> ` before any `$ `"))?;
                    step.command.push('\n');
                    step.command.push_str(more);
                } else {
                    let step =
                        steps.last_mut().ok_or(format!("{at}: output before any command"))?;
                    step.expected.push_str(line);
                    step.expected.push('\n');
                }
            }
            Some("sh" | "bash" | "shell" | "zsh" | "") => {
                // The command or the reference service, by name or by path.
                let runs = line.split_whitespace().any(|word| {
                    let name = word.rsplit('/').next().unwrap_or(word);
                    name == "toolledger" || name == "toolledger-refundd"
                });
                if runs {
                    return Err(format!(
                        "{at}: a shell block runs toolledger but is not a `console` block, so no \
                         test checks it"
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(steps)
}

/// The script a person would type: every step, each announced by a marker line.
fn script(steps: &[Step]) -> String {
    let mut script = String::from("set -euo pipefail\nexec 2>&1\n");
    for (index, step) in steps.iter().enumerate() {
        script.push_str(&format!("printf '%s\\n' '{}'\n", marker(index)));
        if step.command.starts_with("cargo build ") {
            script.push_str(":\n");
        } else {
            script.push_str(&step.command);
            script.push('\n');
        }
    }
    script.push_str(&format!("printf '%s\\n' '{}'\n", marker(steps.len())));
    script
}

fn marker(index: usize) -> String {
    format!("<<<toolledger-doc-step {index}>>>")
}

/// Runs the document at `relative` and checks its transcript.
fn check_document(relative: &str) {
    check_markdown(relative, &std::fs::read_to_string(workspace(relative)).unwrap());
}

/// Runs `markdown`'s console steps and checks its transcript, panicking with the
/// difference.
fn check_markdown(relative: &str, markdown: &str) {
    let steps = steps(relative, markdown).unwrap_or_else(|why| panic!("{why}"));
    if steps.is_empty() {
        return;
    }
    let postgres =
        <toolledger_conformance::Postgres as toolledger_conformance::StoreUnderTest>::fresh();
    let scratch = tempfile::tempdir().unwrap();
    let (home, tmp, work) =
        (scratch.path().join("home"), scratch.path().join("tmp"), scratch.path().join("work"));
    for dir in [&home, &tmp, &work.join("fixtures")] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::create_dir_all(work.join("fixtures/tools")).unwrap();
    let tools = std::fs::read_dir(workspace("fixtures/tools"))
        .unwrap()
        .map(|entry| format!("tools/{}", entry.unwrap().file_name().to_string_lossy()));
    for fixture in
        ["persistence-case.json".to_owned(), "claims.json".to_owned()].into_iter().chain(tools)
    {
        std::fs::copy(
            workspace(&format!("fixtures/{fixture}")),
            work.join("fixtures").join(&fixture),
        )
        .unwrap();
    }
    let binaries = PathBuf::from(env!("CARGO_BIN_EXE_toolledger"));
    let binaries = binaries.parent().unwrap();
    assert!(binaries.join("toolledger-refundd").exists(), "toolledger-refundd is not built");
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(script(&steps))
        .current_dir(&work)
        .env_clear()
        .env("PATH", format!("{}:/usr/local/bin:/usr/bin:/bin", binaries.display()))
        .env("HOME", &home)
        .env("TMPDIR", &tmp)
        .env("LANG", "C.UTF-8")
        .env("DATABASE_URL", postgres.url());
    command.stdin(Stdio::null());
    let run = finish(command);

    // The transcript, step by step, beside what the document shows.
    let (mut actual, mut expected) = (String::new(), String::new());
    let mut rest = run.stdout.as_str();
    for (index, step) in steps.iter().enumerate() {
        // Each step's output runs from its marker line to the next marker: a step the
        // run never reached shows as the transcript's end.
        let Some((_, output)) = rest.split_once(&format!("{}\n", marker(index))) else { break };
        let this = output.split_once(&marker(index + 1)).map_or(output, |(this, _)| this);
        rest = output.get(this.len()..).unwrap_or_default();
        for (text, into) in [(this, &mut actual), (step.expected.as_str(), &mut expected)] {
            into.push_str(&format!("$ {}\n{text}", step.command));
        }
    }
    assert!(
        run.code == 0,
        "{relative}: the run stopped (exit {}) after this transcript:\n{actual}\n(stderr: {})",
        run.code,
        run.stderr
    );
    // Backslashes are text here (shell escapes), not Windows path separators.
    snapbox::Assert::new().normalize_paths(false).eq(actual, expected);
    assert_clean(relative, &tmp, &work);
}

/// `TMPDIR` is empty and the working directory holds only the fixtures.
fn assert_clean(relative: &str, tmp: &Path, work: &Path) {
    let names = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(names(tmp), Vec::<String>::new(), "{relative} left temporary files");
    assert_eq!(names(work), ["fixtures"], "{relative} left files in the working directory");
}

#[test]
fn every_console_example_in_the_documentation_prints_what_it_shows() {
    let mut documents = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(workspace("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    documents.extend(docs);
    let mut checked = 0;
    for document in &documents {
        let markdown = std::fs::read_to_string(workspace(document)).unwrap();
        if markdown.contains("```console") {
            checked += 1;
        }
        check_document(document);
    }
    assert!(checked >= 3, "README.md, docs/http.md and docs/postgres.md have console examples");
}

#[test]
fn the_document_parser_refuses_unchecked_blocks_and_stray_lines() {
    let ok = "text\n```console\n$ echo a\n> b\na b\n```\n```sh\ncargo xtask ci\n```\n";
    let parsed = steps("ok.md", ok).unwrap();
    assert_eq!(parsed.len(), 1);
    assert_eq!((parsed[0].command.as_str(), parsed[0].expected.as_str()), ("echo a\nb", "a b\n"));
    for bad in [
        "```sh\ntoolledger audit\n```\n",
        "```\ntarget/release/toolledger --help\n```\n",
        "```console\noutput first\n```\n",
        "```console\n```sh\n```\n",
    ] {
        assert!(steps("bad.md", bad).is_err(), "{bad:?}");
    }
}

#[test]
fn a_wrong_output_a_failing_command_or_a_leftover_file_fails_the_check() {
    let fails = |markdown: &'static str| {
        std::panic::catch_unwind(|| check_markdown("case.md", markdown)).is_err()
    };
    assert!(!fails("```console\n$ echo hi\nhi\n$ printf 'a\\nb\\nc\\n'\na\n...\n```\n"));
    assert!(fails("```console\n$ echo hi\nho\n```\n"), "a wrong line");
    assert!(fails("```console\n$ echo hi\n```\n"), "an output the document does not show");
    assert!(fails("```console\n$ false\n$ echo after\nafter\n```\n"), "a failing command");
    assert!(fails("```console\n$ mktemp -d\n[..]\n```\n"), "a temporary directory left");
    assert!(fails("```console\n$ touch stray\n```\n"), "a file left in the working directory");
    // A process left running with the transcript's pipe (a server a script never
    // stopped) is killed with the script's process group, not waited for.
    assert!(!fails("```console\n$ sleep 300 &\n```\n"));
}
