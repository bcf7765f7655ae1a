//! Eight `toolledger` processes against one database file at once.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::{Dir, Run};

fn race(dir: &Dir, cases: &[String]) -> Vec<Run> {
    let children: Vec<_> = cases
        .iter()
        .map(|case| {
            dir.command(&["--fixture", case, "dispatch"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children.into_iter().map(|child| Run::from(child.wait_with_output().unwrap())).collect()
}

fn tally(runs: &[Run]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for run in runs {
        assert_ne!(run.code, 2, "a process failed: {run:?}");
        let answer = run.answer();
        let key =
            answer["delivery"].as_str().or(answer["code"].as_str()).unwrap_or_default().to_owned();
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}

#[test]
fn eight_processes_dispatching_one_case_make_one_refund() {
    let dir = Dir::new();
    let runs = race(&dir, &vec!["case.json".to_owned(); 8]);
    let counts = tally(&runs);
    assert_eq!(counts.get("fresh"), Some(&1), "{counts:?}");
    assert!(
        counts
            .keys()
            .all(|key| ["fresh", "local_replay", "OUTCOME_UNKNOWN"].contains(&key.as_str())),
        "{counts:?}"
    );
    assert_eq!(dir.db_int("SELECT count(*) FROM downstream_receipts"), 1);
    assert_eq!(dir.db_int("SELECT count(*) FROM operations"), 1);
}

#[test]
fn eight_processes_with_eight_intents_under_one_key_one_wins() {
    let dir = Dir::new();
    let names: Vec<String> = (0..8)
        .map(|index| {
            let name = format!("case-{index}.json");
            dir.write_case(&name, |case| {
                case["proposal"]["arguments"]["amount_minor"] = Value::from(2590 + index)
            });
            name
        })
        .collect();
    let counts = tally(&race(&dir, &names));
    assert_eq!(counts.get("fresh"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("IDEMPOTENCY_CONFLICT"), Some(&7), "{counts:?}");
    assert_eq!(dir.db_int("SELECT count(*) FROM downstream_receipts"), 1);
}
