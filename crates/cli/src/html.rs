//! The dashboard's pages, rendered on the server: plain HTML and one stylesheet, no
//! script. Everything shown passes through [`escape`], whatever its origin: a tool's
//! arguments, a reason an operator typed, a downstream's refusal.

use std::fmt::Write as _;

use serde_json::Value;

/// `text` with `& < > " '` replaced by entities: safe in element content and in quoted
/// attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(ch),
        }
    }
    out
}

/// `text` as a URL query value: unreserved characters as they are, every other byte
/// percent-encoded.
pub(crate) fn query_value(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// The stylesheet, served at `/style.css` (the pages' policy allows no inline style).
pub(crate) const STYLE: &str = "\
body{font:15px/1.45 system-ui,sans-serif;margin:0;color:#1d2329;background:#f6f7f9}
header{background:#1d2329;color:#fff;padding:.6em 1.5em;display:flex;gap:2em;align-items:baseline}
header a{color:#cfe3ff;text-decoration:none}header strong{font-size:1.1em}
main{padding:1em 1.5em;max-width:72em}
h1{font-size:1.35em}h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse;background:#fff;margin:.4em 0}
th,td{border:1px solid #d5d9de;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#eef0f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
td{overflow-wrap:anywhere}#history th{width:12em}
code,.ref{font-family:ui-monospace,monospace;font-size:.92em}
.figure{display:inline-block;background:#fff;border:1px solid #d5d9de;padding:.5em 1em;margin:.2em .4em .2em 0}
.figure b{display:block;font-size:1.4em}
.state-dead,.state-quarantined,.state-failed{color:#a4161a;font-weight:600}
.state-unknown{color:#b35c00;font-weight:600}.state-succeeded{color:#22663a}
.error{background:#fde8e8;border:1px solid #d98c8c;padding:.5em 1em}
form.filter{display:flex;gap:.8em;align-items:end;flex-wrap:wrap;margin:.5em 0}
label{display:flex;flex-direction:column;font-size:.85em}
input,select,button{font:inherit;padding:.2em .4em}
svg{background:#fff;border:1px solid #d5d9de}
.empty{color:#66707a;font-style:italic}
";

/// A whole page: the header with the navigation, then `body`.
pub(crate) fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · toolledger</title><link rel=\"stylesheet\" href=\"/style.css\"></head>\
         <body><header><strong>toolledger</strong><a href=\"/\">Overview</a>\
         <a href=\"/operations\">Operations</a><a href=\"/tools\">Tools</a>\
         <a href=\"/metrics\">Metrics</a></header>\
         <main>{body}</main></body></html>\n",
        title = escape(title),
    )
}

/// `seconds` as a short age: `42 s`, `7 min`, `3 h`, `12 d`.
pub(crate) fn age(seconds: i64) -> String {
    match seconds {
        ..=119 => format!("{seconds} s"),
        120..=7_199 => format!("{} min", seconds / 60),
        7_200..=172_799 => format!("{} h", seconds / 3_600),
        _ => format!("{} d", seconds / 86_400),
    }
}

/// A state, marked for the stylesheet.
pub(crate) fn state(state: &str) -> String {
    format!("<span class=\"state-{0}\">{0}</span>", escape(state))
}

/// A link to one operation's page.
pub(crate) fn operation_link(status_ref: &str) -> String {
    format!(
        "<a class=\"ref\" href=\"/operations/{}\">{}</a>",
        query_value(status_ref),
        escape(status_ref)
    )
}

/// A JSON value as text for a table cell: strings as they are, `null` as a dash, the
/// rest in compact JSON; escaped.
pub(crate) fn cell(value: &Value) -> String {
    match value {
        Value::Null => "–".to_owned(),
        Value::String(text) => escape(text),
        other => format!("<code>{}</code>", escape(&other.to_string())),
    }
}

/// A line plot of `(instant, value)` samples as inline SVG: time across, value up, the
/// largest value and the span labelled. Fewer than two samples is said in words.
pub(crate) fn plot(samples: &[(i64, i64)], label: &str) -> String {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return "<p class=\"empty\">No samples yet.</p>".to_owned();
    };
    if samples.len() < 2 {
        return "<p class=\"empty\">One sample so far: the plot starts with the next.</p>"
            .to_owned();
    }
    let (width, height) = (640_i64, 160_i64);
    let span = (last.0 - first.0).max(1);
    let top = samples.iter().map(|sample| sample.1).max().unwrap_or(0).max(1);
    let points: Vec<String> = samples
        .iter()
        .map(|(at, value)| {
            let x = (at - first.0) * (width - 20) / span + 10;
            let y = height - 10 - value * (height - 30) / top;
            format!("{x},{y}")
        })
        .collect();
    format!(
        "<svg id=\"lag-plot\" role=\"img\" aria-label=\"{label}\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" xmlns=\"http://www.w3.org/2000/svg\">\
         <polyline fill=\"none\" stroke=\"#2f6fd0\" stroke-width=\"2\" points=\"{points}\"/>\
         <text x=\"12\" y=\"14\" font-size=\"11\">max {top_text}</text>\
         <text x=\"{right}\" y=\"{bottom}\" font-size=\"11\" text-anchor=\"end\">last {span_text}</text></svg>",
        label = escape(label),
        points = points.join(" "),
        top_text = escape(&age(top)),
        right = width - 8,
        bottom = height - 2,
        span_text = escape(&age(span)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_covers_every_character_that_ends_text_or_an_attribute() {
        assert_eq!(
            escape(r#"<script>alert('x')</script> & "q""#),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        assert_eq!(query_value("sr_a b/&?"), "sr_a%20b%2F%26%3F");
    }

    #[test]
    fn ages_and_plots_read_well() {
        assert_eq!(
            (age(5), age(600), age(7_200), age(900_000)),
            ("5 s".into(), "10 min".into(), "2 h".into(), "10 d".into())
        );
        assert!(plot(&[], "lag").contains("No samples"));
        let svg = plot(&[(0, 0), (10, 5), (20, 10)], "lag");
        assert!(svg.contains("points=\"10,150 320,85 630,20\""), "{svg}");
    }
}
