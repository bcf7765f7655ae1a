//! The dashboard in a real browser: headless Chromium driven over WebDriver by
//! ChromeDriver (Debian's `chromium` and `chromium-driver`, which `.ci/run` installs).
//! It loads the overview, filters the list, opens an operation, is refused a requeue
//! without the token, requeues with it and sees the operation pending again. A
//! screenshot of each page goes to `target/screenshots/` for review; `cargo xtask
//! screenshots` copies the overview's into the README.
//!
//! Without Chromium or ChromeDriver the test fails: a browser check that cannot run is
//! not a pass.

use std::{
    net::TcpListener,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::{
    Dir,
    dashboard::{Dashboard, TOKEN, ledger},
    workspace,
};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The W3C name of an element reference in WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// ChromeDriver on a free loopback port, with one headless Chromium session; both
/// stopped when dropped.
struct Browser {
    driver: Child,
    base: String,
    session: String,
    agent: ureq::Agent,
}

impl Browser {
    fn start() -> Browser {
        for binary in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                std::path::Path::new(binary).exists(),
                "{binary} is missing: install Debian's chromium and chromium-driver (.ci/run does)"
            );
        }
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let driver = Command::new(CHROMEDRIVER)
            .args([format!("--port={port}"), "--allowed-ips=127.0.0.1".to_owned()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .new_agent();
        let base = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        while agent.get(format!("{base}/status")).call().is_err() {
            assert!(started.elapsed() < Duration::from_secs(20), "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut browser = Browser { driver, base, session: String::new(), agent };
        let created = browser.call(
            "POST",
            "/session",
            &json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": CHROMIUM,
                    "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                             "--disable-dev-shm-usage", "--window-size=1200,900",
                             "--force-device-scale-factor=1"],
                },
            }}}),
        );
        browser.session =
            created["sessionId"].as_str().unwrap_or_else(|| panic!("{created}")).to_owned();
        browser
    }

    /// One WebDriver command: its `value`, or a panic naming the error.
    fn call(&self, method: &str, path: &str, body: &Value) -> Value {
        let url = format!("{}{path}", self.base);
        let response = match method {
            "GET" => self.agent.get(&url).call(),
            "DELETE" => self.agent.delete(&url).call(),
            _ => self
                .agent
                .post(&url)
                .header("Content-Type", "application/json")
                .send(body.to_string()),
        };
        let mut response = response.unwrap_or_else(|err| panic!("{method} {path}: {err}"));
        let text = response.body_mut().read_to_string().unwrap_or_default();
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert!(
            value["value"]["error"].is_null(),
            "{method} {path}: {}",
            value["value"]["message"]
        );
        value["value"].clone()
    }

    fn in_session(&self, method: &str, path: &str, body: &Value) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    fn open(&self, url: &str) {
        self.in_session("POST", "/url", &json!({"url": url}));
    }

    fn element(&self, css: &str) -> String {
        let found =
            self.in_session("POST", "/element", &json!({"using": "css selector", "value": css}));
        found[ELEMENT].as_str().unwrap_or_else(|| panic!("{css}: {found}")).to_owned()
    }

    fn click(&self, css: &str) {
        let element = self.element(css);
        self.in_session("POST", &format!("/element/{element}/click"), &json!({}));
    }

    fn type_into(&self, css: &str, text: &str) {
        let element = self.element(css);
        self.in_session("POST", &format!("/element/{element}/value"), &json!({"text": text}));
    }

    fn text(&self, css: &str) -> String {
        let element = self.element(css);
        self.in_session("GET", &format!("/element/{element}/text"), &Value::Null)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Waits (at most 20 s) until the page the browser shows satisfies `ready`: a click
    /// that submits a form or follows a link returns before the next page has loaded.
    fn wait_until(&self, what: &str, ready: impl Fn(&str, &str) -> bool) {
        let started = Instant::now();
        loop {
            let (url, source) = (self.url(), self.source());
            if ready(&url, &source) {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{what}: still at {url}: {source}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn url(&self) -> String {
        self.in_session("GET", "/url", &Value::Null).as_str().unwrap_or_default().to_owned()
    }

    fn source(&self) -> String {
        self.in_session("GET", "/source", &Value::Null).as_str().unwrap_or_default().to_owned()
    }

    /// A PNG of the page as the browser shows it, saved as `target/screenshots/NAME.png`.
    fn screenshot(&self, name: &str) -> PathBuf {
        let encoded = self.in_session("GET", "/screenshot", &Value::Null);
        let png = base64(encoded.as_str().unwrap_or_default());
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{name}: not a PNG");
        let dir = workspace("target/screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.agent.delete(format!("{}/session/{}", self.base, self.session)).call();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Standard base64 (RFC 4648, with padding) decoded; what WebDriver sends screenshots in.
fn base64(text: &str) -> Vec<u8> {
    let value = |byte: u8| match byte {
        b'A'..=b'Z' => Some(byte - b'A'),
        b'a'..=b'z' => Some(byte - b'a' + 26),
        b'0'..=b'9' => Some(byte - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let digits: Vec<u8> = text.bytes().filter_map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let bits = chunk.iter().fold(0_u32, |acc, digit| (acc << 6) | u32::from(*digit))
            << (6 * (4 - chunk.len()));
        let bytes = bits.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

#[test]
fn an_operator_filters_opens_and_requeues_a_dead_letter_in_chromium() {
    let dir = Dir::new();
    let [_, dead, unknown, _] = ledger(&dir);
    dir.write("token", format!("{TOKEN}\n").as_bytes());
    let server = Dashboard::start(
        &dir,
        &["--allow-actions", "--token-file", "token", "--sample-seconds", "1"],
    );
    // Three lag samples, so the overview's plot has a line.
    std::thread::sleep(Duration::from_millis(2_500));
    let browser = Browser::start();

    browser.open(&format!("{}/", server.base));
    assert_eq!(browser.text("#count-dead b"), "1");
    assert_eq!(browser.text("#count-unknown b"), "1");
    assert!(browser.source().contains("<polyline"), "the lag plot is drawn");
    assert!(browser.text("#unknown").contains("Unknown outcomes"));
    assert!(browser.source().contains(&unknown));
    browser.screenshot("overview");

    browser.click("header a[href='/operations']");
    browser.wait_until("the list", |url, _| url.ends_with("/operations"));
    browser.click("#filter-state option[value='dead']");
    browser.type_into("#filter-tool", "refund_order");
    browser.click("#filter-apply");
    browser.wait_until("the filtered list", |url, _| url.contains("state=dead"));
    assert!(browser.url().contains("tool=refund_order"), "{}", browser.url());
    assert!(browser.source().contains(&dead));
    browser.screenshot("list");

    browser.click(&format!("a[href='/operations/{dead}']"));
    browser.wait_until("the operation", |url, _| url.ends_with(&format!("/operations/{dead}")));
    assert_eq!(browser.text("#status"), "dead");
    browser.screenshot("operation");

    // Without the token: refused, nothing changed.
    browser.type_into("#requeue-reason", "the payment API is back");
    browser.click("#requeue-go");
    browser.wait_until("the refusal", |_, source| source.contains("TOKEN_REQUIRED"));
    browser.screenshot("requeue-refused");
    assert_eq!(
        dir.db_text(&format!("SELECT status FROM operations WHERE status_ref = '{dead}'")),
        "dead"
    );

    // With it: pending again, and the reason in the operator log.
    browser.open(&format!("{}/operations/{dead}", server.base));
    browser.type_into("#requeue-reason", "the payment API is back");
    browser.type_into("#requeue-token", TOKEN);
    browser.click("#requeue-go");
    browser.wait_until("the requeued operation", |url, source| {
        url.ends_with(&format!("/operations/{dead}")) && source.contains("state-pending")
    });
    assert_eq!(browser.text("#status"), "pending");
    assert!(browser.text("#operator-log").contains("the payment API is back"));
    browser.screenshot("requeued");
    assert_eq!(
        dir.db_text(&format!("SELECT status FROM operations WHERE status_ref = '{dead}'")),
        "pending"
    );
}

#[test]
fn base64_decodes_what_webdriver_sends() {
    assert_eq!(base64("aGVsbG8="), b"hello");
    assert_eq!(base64("aGVsbG8h"), b"hello!");
    assert_eq!(base64("aGk="), b"hi");
}
