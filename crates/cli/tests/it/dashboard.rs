//! `toolledger serve`, the operator's dashboard, as a real process answering real HTTP:
//! what it refuses to start with, what each page shows (escaped, without paths), and
//! who may act. `browser.rs` drives the same pages in headless Chromium.

use std::process::{Child, Stdio};

use serde_json::Value;

use crate::{Dir, SECRET};

/// The instant pages are judged at: 100 s after the case's clock.
pub(crate) const NOW: &str = "1767225700";
/// The token the tests start an acting server with.
pub(crate) const TOKEN: &str = "token-0123456789abcdef";

/// A case file for the `n`th distinct intent (its own key and model call).
pub(crate) fn variant(dir: &Dir, n: usize) -> String {
    let name = format!("case-{n}.json");
    dir.write_case(&name, |case| {
        let host = &mut case["host_context"];
        host["idempotency_key"] = Value::from(format!("key-{n}"));
        host["provider_call_id"] = Value::from(format!("call-{n}"));
        host["provider_response_id"] = Value::from(format!("resp-{n}"));
        host["operation_id"] = Value::from(format!("op-{n}"));
    });
    name
}

/// A ledger holding one operation in each state an operator looks for: succeeded
/// (case 0), dead (case 1), unknown (case 2) and pending (case 3). Their status refs, in
/// that order.
pub(crate) fn ledger(dir: &Dir) -> [String; 4] {
    let run = |args: &[&str]| dir.run(args);
    let done = run(&["dispatch", "--case", &variant(dir, 0)]);
    assert_eq!(done.text("/delivery"), "fresh", "{done:?}");
    let dead = run(&["dispatch", "--case", &variant(dir, 1), "--failure", "after_intent_commit"]);
    let relay = run(&[
        "relay",
        "--case",
        "case-1.json",
        "--once",
        "--simulate-unavailable",
        "100",
        "--max-attempts",
        "1",
        "--now",
        "1767225600",
    ]);
    assert_eq!(relay.answer()["relay"]["dead"], 1, "{relay:?}");
    let unknown =
        run(&["dispatch", "--case", &variant(dir, 2), "--failure", "after_downstream_commit"]);
    let pending =
        run(&["dispatch", "--case", &variant(dir, 3), "--failure", "after_intent_commit"]);
    [done, dead, unknown, pending].map(|run| run.text("/status_ref"))
}

/// `toolledger serve` on a free loopback port, stopped when dropped.
pub(crate) struct Dashboard {
    child: Child,
    pub(crate) base: String,
}

impl Dashboard {
    pub(crate) fn start(dir: &Dir, extra: &[&str]) -> Dashboard {
        let mut args = vec!["--now", NOW];
        args.extend_from_slice(extra);
        Dashboard::with(dir, &args)
    }

    /// `toolledger serve` with `extra`, on the machine's clock unless they give `--now`.
    pub(crate) fn with(dir: &Dir, extra: &[&str]) -> Dashboard {
        let mut args = vec!["serve", "--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        let mut child =
            dir.command(&args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        Dashboard { base: crate::listening_base(&mut child), child }
    }

    /// `GET path`: the status and the body.
    pub(crate) fn get(&self, path: &str) -> (u16, String) {
        answer(agent().get(format!("{}{path}", self.base)).call())
    }

    /// `POST path` with a form body and extra headers.
    fn post(&self, path: &str, form: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let mut request = agent()
            .post(format!("{}{path}", self.base))
            .header("Content-Type", "application/x-www-form-urlencoded");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        answer(request.send(form.to_owned()))
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client that returns every status as it is and follows no redirect.
fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).max_redirects(0).build().new_agent()
}

fn answer(response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> (u16, String) {
    let mut response = response.unwrap();
    let status = response.status().as_u16();
    (status, response.body_mut().read_to_string().unwrap_or_default())
}

/// No page shows where the ledger lives or raw SQL.
fn assert_discreet(body: &str) {
    for leak in [SECRET, "/tmp", ".sqlite3", "SELECT", "sqlite failed", "<script"] {
        assert!(!body.contains(leak), "a page shows {leak:?}: {body}");
    }
}

#[test]
fn serve_refuses_to_start_unsafely_and_creates_nothing() {
    let dir = Dir::new();
    dir.run(&["serve", "--listen", "127.0.0.1:0"]).assert_error("STORE_NOT_FOUND");
    assert!(!dir.join("toolledger.sqlite3").exists());
    dir.run(&["dispatch", "--case", "case.json"]);
    dir.write("token", format!("{TOKEN}\n").as_bytes());
    dir.write("short", b"abc\n");
    for (args, message) in [
        (
            &["--listen", "0.0.0.0:0"][..],
            "--listen on a non-loopback address needs --allow-remote and --token-file",
        ),
        (
            &["--listen", "0.0.0.0:0", "--allow-remote"],
            "--listen on a non-loopback address needs --allow-remote and --token-file",
        ),
        (&["--listen", "127.0.0.1:0", "--allow-actions"], "--allow-actions needs --token-file"),
        (
            &["--listen", "127.0.0.1:0", "--token-file", "short"],
            "the token file must hold one line of at least 16 visible ASCII characters",
        ),
        (&["--listen", "127.0.0.1:0", "--token-file", "missing"], "the token file was not found"),
    ] {
        let mut all = vec!["serve"];
        all.extend_from_slice(args);
        let run = dir.run(&all);
        run.assert_error("USAGE_ERROR");
        assert!(run.stderr.contains(message), "{args:?}: {}", run.stderr);
    }
}

#[test]
fn every_page_shows_the_ledger_escaped_and_without_paths() {
    let dir = Dir::new();
    let [done, dead, unknown, pending] = ledger(&dir);
    let server = Dashboard::start(&dir, &[]);

    let (status, overview) = server.get("/");
    assert_eq!(status, 200, "{overview}");
    for (state, count) in
        [("pending", 1), ("unknown", 1), ("succeeded", 1), ("dead", 1), ("failed", 0)]
    {
        assert!(
            overview.contains(&format!("id=\"count-{state}\">"))
                && overview.contains(&format!("{state}</span> <b>{count}</b>")),
            "{state} {count}: {overview}"
        );
    }
    // 100 s after the pending one was accepted, and the server's clock moves on.
    assert!(overview.contains("oldest pending <b>10"), "{overview}");
    for (section, status_ref) in [("id=\"dead\"", &dead), ("id=\"unknown\"", &unknown)] {
        let at = overview.find(section).unwrap();
        assert!(overview[at..].contains(status_ref.as_str()), "{section}");
    }
    assert!(overview.contains("toolledger status --status-ref REF"));
    assert_discreet(&overview);

    let (_, dead_list) = server.get("/operations?state=dead");
    assert!(dead_list.contains(&dead) && !dead_list.contains(&done), "{dead_list}");
    let (_, by_tool) = server.get("/operations?tool=refund_order&older_than_minutes=1");
    for status_ref in [&done, &dead, &unknown, &pending] {
        assert!(by_tool.contains(status_ref.as_str()), "{status_ref}: {by_tool}");
    }
    let (_, other_tool) = server.get("/operations?tool=%3Cscript%3Ealert(1)%3C%2Fscript%3E");
    assert!(other_tool.contains("value=\"&lt;script&gt;alert(1)&lt;/script&gt;\""), "{other_tool}");
    assert!(other_tool.contains("None."));
    assert_discreet(&other_tool);
    let (status, _) = server.get("/operations?state=bogus");
    assert_eq!(status, 400);
    let (status, found) = server.get(&format!("/operations?q={dead}"));
    assert_eq!((status, found.as_str()), (303, ""));

    let (status, page) = server.get(&format!("/operations/{dead}"));
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Read-only"), "{page}");
    assert!(!page.contains("<form method=\"post\""), "a read-only server offers no action");
    assert!(!page.contains("ord-1001"), "arguments are hidden by default");
    assert_discreet(&page);
    let (status, _) = server.get("/operations/sr_00000000000000000000000000000000");
    assert_eq!(status, 404);
    let (status, _) = server.get("/operations/../../etc/passwd");
    assert_eq!(status, 404);

    let (status, metrics) = server.get("/metrics");
    assert_eq!(status, 200);
    assert!(metrics.contains("toolledger_operations{state=\"dead\"} 1\n"), "{metrics}");
    assert_eq!(server.get("/healthz"), (200, "ok\n".to_owned()));

    let (status, refused) = server.post(
        &format!("/operations/{dead}/requeue"),
        "reason=x",
        &[("X-Toolledger-Token", TOKEN)],
    );
    assert_eq!(status, 403, "{refused}");
    assert!(refused.contains("READ_ONLY"));
    assert_eq!(
        dir.db_text(&format!("SELECT status FROM operations WHERE status_ref = '{dead}'")),
        "dead"
    );

    // Another site's name for this address (DNS rebinding) is refused.
    let rebound = agent().get(format!("{}/", server.base)).header("Host", "evil.example:80").call();
    assert_eq!(answer(rebound).0, 421);

    let shown = Dashboard::start(&dir, &["--show-arguments"]);
    let (_, page) = shown.get(&format!("/operations/{dead}"));
    assert!(page.contains("ord-1001"), "{page}");
}

#[test]
fn requeue_needs_the_token_and_the_dashboard_s_own_origin() {
    let dir = Dir::new();
    let [done, dead, ..] = ledger(&dir);
    dir.write("token", format!("{TOKEN}\n").as_bytes());
    let server = Dashboard::start(&dir, &["--allow-actions", "--token-file", "token"]);
    let path = format!("/operations/{dead}/requeue");
    let origin = server.base.clone();
    let state =
        || dir.db_text(&format!("SELECT status FROM operations WHERE status_ref = '{dead}'"));

    for (form, headers, code) in [
        ("reason=back", vec![("Origin", origin.as_str())], "TOKEN_REQUIRED"),
        (
            "reason=back&token=token-0123456789abcdeX",
            vec![("Origin", origin.as_str())],
            "TOKEN_REQUIRED",
        ),
        (
            &*format!("reason=back&token={TOKEN}"),
            vec![("Origin", "http://evil.example")],
            "CROSS_SITE",
        ),
        (
            &*format!("reason=back&token={TOKEN}"),
            vec![("Origin", origin.as_str()), ("Sec-Fetch-Site", "cross-site")],
            "CROSS_SITE",
        ),
        (
            &*format!("reason=back&token={TOKEN}"),
            vec![("Referer", "http://evil.example/x")],
            "CROSS_SITE",
        ),
        (&*format!("reason=back&token={TOKEN}"), vec![], "CROSS_SITE"),
    ] {
        let (status, body) = server.post(&path, form, &headers);
        assert_eq!(status, 403, "{form} {headers:?}: {body}");
        assert!(body.contains(code), "{form} {headers:?}: {body}");
        assert!(!body.contains(TOKEN), "an error page repeats the token");
        assert_eq!(state(), "dead");
    }
    let (status, body) =
        server.post(&path, &format!("token={TOKEN}&reason=+"), &[("Origin", &origin)]);
    assert_eq!((status, state().as_str()), (400, "dead"), "{body}");

    let reason = "the API is back <script>alert(1)</script>";
    let (status, body) = server.post(
        &path,
        &format!("reason=the+API+is+back+%3Cscript%3Ealert(1)%3C%2Fscript%3E&token={TOKEN}"),
        &[("Origin", &origin)],
    );
    assert_eq!((status, body.as_str()), (303, ""));
    assert_eq!(state(), "pending");
    let (_, page) = server.get(&format!("/operations/{dead}"));
    assert!(page.contains("state-pending"), "{page}");
    assert!(page.contains(&crate::dashboard::escaped(reason)), "the reason, escaped: {page}");
    assert_discreet(&page);
    // A script with the token in a header, no browser marks: accepted; and a succeeded
    // operation is not requeued.
    let (status, body) = server.post(
        &format!("/operations/{done}/requeue"),
        "reason=again",
        &[("X-Toolledger-Token", TOKEN)],
    );
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("NOT_REQUEUEABLE"));
    assert_eq!(dir.db_int("SELECT count(*) FROM operator_log"), 1);
}

#[test]
fn the_list_pages_through_every_operation_once() {
    let dir = Dir::new();
    for n in 0..57 {
        let run =
            dir.run(&["dispatch", "--case", &variant(&dir, n), "--failure", "after_intent_commit"]);
        assert_eq!(run.code, 1, "{run:?}");
    }
    let server = Dashboard::start(&dir, &[]);
    let mut seen = Vec::new();
    let mut next = Some("/operations?state=pending".to_owned());
    while let Some(path) = next.take() {
        let (status, page) = server.get(&path);
        assert_eq!(status, 200, "{page}");
        let mut rest = page.as_str();
        while let Some(at) = rest.find("href=\"/operations/sr_") {
            let start = at + "href=\"/operations/".len();
            seen.push(rest[start..start + 35].to_owned());
            rest = &rest[start..];
        }
        next = page
            .split_once("id=\"next-page\" href=\"")
            .map(|(_, after)| after.split('"').next().unwrap_or_default().replace("&amp;", "&"));
        assert!(seen.len() <= 57, "the walk does not end");
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!((seen.len(), unique.len()), (57, 57));
}

/// `text` as the pages escape it.
pub(crate) fn escaped(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// A host's downstream that refuses every request with a reason full of markup.
#[derive(Debug)]
struct Hostile(toolledger::DownstreamIdentity);

impl toolledger::Downstream for Hostile {
    fn identity(&self) -> &toolledger::DownstreamIdentity {
        &self.0
    }

    fn execute(
        &self,
        _request: &toolledger::DownstreamRequest,
        _now: toolledger::UnixSeconds,
    ) -> Result<toolledger::DownstreamReceipt, toolledger::DownstreamError> {
        Err(toolledger::DownstreamError::Refused {
            reason: "<script>alert('refused')</script><img src=x onerror=alert(1)>".to_owned(),
        })
    }

    fn lookup(
        &self,
        _request: &toolledger::DownstreamRequest,
    ) -> Result<toolledger::Lookup, toolledger::DownstreamError> {
        Ok(toolledger::Lookup::NotFound)
    }
}

#[test]
fn text_a_downstream_wrote_is_shown_as_text() {
    let dir = Dir::new();
    let case = toolledger::load_case(
        &std::fs::read(crate::workspace("fixtures/persistence-case.json")).unwrap(),
        &toolledger::Registry::builtin(),
        None,
    )
    .unwrap();
    let hostile = Hostile(toolledger::DownstreamIdentity::new("hostile", "1").unwrap());
    let host = toolledger::Ledger::builder(dir.location())
        .tool(toolledger::RefundOrder::default().tool())
        // The case's instants, as the dashboard's --now judges them (a PostgreSQL ledger
        // would otherwise stamp the database's clock).
        .store_clock(toolledger::StoreClock::Caller)
        .worker_id("host-worker")
        .open(hostile, toolledger::NoRoles)
        .unwrap();
    let refused = host.dispatch_loaded(&case).unwrap();
    assert_eq!(refused.package()["code"], "DOWNSTREAM_REFUSED", "{}", refused.package());
    let status_ref = refused.package()["status_ref"].as_str().unwrap().to_owned();
    drop(host);

    let server = Dashboard::start(&dir, &["--show-arguments"]);
    for path in ["/operations?state=failed".to_owned(), format!("/operations/{status_ref}")] {
        let (status, page) = server.get(&path);
        assert_eq!(status, 200, "{page}");
        assert!(page.contains("&lt;script&gt;alert(&#39;refused&#39;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"), "{path}: {page}");
        assert!(!page.contains("<img") && !page.contains("<script"), "{path}: {page}");
        assert_discreet(&page);
    }
}

#[test]
fn requeue_refuses_any_foreign_browser_mark_and_reasons_that_do_not_decode() {
    let dir = Dir::new();
    let [_, dead, ..] = ledger(&dir);
    dir.write("token", format!("{TOKEN}\n").as_bytes());
    let server = Dashboard::start(&dir, &["--allow-actions", "--token-file", "token"]);
    let path = format!("/operations/{dead}/requeue");
    let origin = server.base.clone();
    let page = format!("{origin}/operations/{dead}");
    let unchanged = || {
        assert_eq!(
            dir.db_text(&format!("SELECT status FROM operations WHERE status_ref = '{dead}'")),
            "dead"
        );
        assert_eq!(dir.db_int("SELECT count(*) FROM operator_log"), 0);
    };
    let form = format!("reason=back&token={TOKEN}");
    let lookalike = format!("{origin}.evil.example/x");
    for (form, headers) in [
        // A typed or bookmarked request is no form of ours, even with the token header.
        ("reason=back", vec![("X-Toolledger-Token", TOKEN), ("Sec-Fetch-Site", "none")]),
        (form.as_str(), vec![("Origin", origin.as_str()), ("Sec-Fetch-Site", "same-site")]),
        // Each mark present must agree: our Origin does not excuse a foreign Referer,
        // nor our Referer a foreign (or opaque) Origin.
        (form.as_str(), vec![("Origin", origin.as_str()), ("Referer", "http://evil.example/x")]),
        (form.as_str(), vec![("Origin", "null"), ("Referer", page.as_str())]),
        (form.as_str(), vec![("Referer", lookalike.as_str())]),
        (
            "reason=back",
            vec![
                ("X-Toolledger-Token", TOKEN),
                ("Origin", origin.as_str()),
                ("Sec-Fetch-Site", "cross-site"),
            ],
        ),
    ] {
        let (status, body) = server.post(&path, form, &headers);
        assert_eq!(status, 403, "{form} {headers:?}: {body}");
        assert!(body.contains("CROSS_SITE"), "{form} {headers:?}: {body}");
        unchanged();
    }
    // What a browser sends from the operation's page: every mark ours.
    let ours = [("Origin", origin.as_str()), ("Referer", &page), ("Sec-Fetch-Site", "same-origin")];
    let too_long = "a".repeat(513);
    for reason in ["%zz", "a%f", "%ff", "%C3", "a%00b", "a%07b", "%0A", "%7F", "+", &too_long] {
        let (status, body) = server.post(&path, &format!("token={TOKEN}&reason={reason}"), &ours);
        assert_eq!(status, 400, "{reason}: {body}");
        assert!(body.contains("USAGE_ERROR"), "{reason}: {body}");
        assert!(reason.len() < 3 || !body.contains(reason), "the page repeats the input: {body}");
        unchanged();
    }
    // 512 bytes of valid UTF-8 (256 two-byte characters) are taken whole.
    let reason = "\u{e9}".repeat(256);
    let (status, body) =
        server.post(&path, &format!("token={TOKEN}&reason={}", "%C3%A9".repeat(256)), &ours);
    assert_eq!((status, body.as_str()), (303, ""));
    assert_eq!(dir.db_text("SELECT reason FROM operator_log"), reason);
}
