//! The monitoring files in dist/ against what raidfs really emits: every
//! metric the Prometheus rules, their unit tests and the Grafana dashboard
//! name, and every label they match on, group by or print, must be in the
//! metrics a real mount serves; promtool (Debian's prometheus package, which
//! `.ci/run` installs) must accept the rules and pass their unit tests, each
//! alert must have a test that fires it, and every dashboard query must be
//! valid PromQL.
//!
//! promtool is required like the Prometheus parser of tests/metrics_mount.rs:
//! without /usr/bin/promtool the promtool tests fail, saying what to install.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::cli::{check, raidfs_ok, Mirror};
use common::{fuse_available, DaemonGuard};
use serde_json::Value;

const RULES: &str = "dist/prometheus/raidfs.rules.yml";
const RULE_TESTS: &str = "dist/prometheus/raidfs.rules.test.yml";
const DASHBOARD: &str = "dist/grafana/raidfs.json";
/// The program `.ci/run` checks for and installs.
const PROMTOOL: &str = "/usr/bin/promtool";

/// Labels Prometheus adds to every scraped sample.
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

fn source(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read_source(path: &str) -> String {
    fs::read_to_string(source(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The families of Prometheus text, name → type, from its `# TYPE` lines.
/// Every sample must belong to one of them.
fn families(text: &str) -> BTreeMap<String, String> {
    let mut families = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE NAME KIND");
            families.insert(name.to_string(), kind.to_string());
        }
    }
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name: String = line.chars().take_while(|&c| is_ident(c)).collect();
        assert!(
            families.contains_key(&name) || unknown_metrics([&name], &families).is_empty(),
            "sample {name} has no # TYPE line"
        );
    }
    families
}

/// The label names on the samples of Prometheus text.
fn sample_labels(text: &str) -> BTreeSet<String> {
    let mut labels = BTreeSet::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(open) = line.find('{') else { continue };
        labels.extend(matcher_labels(&line[open..]));
    }
    labels
}

/// Every `raidfs_...` metric name in `text`.
fn referenced_metrics(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    let mut before = None;
    while let Some(at) = rest.find("raidfs_") {
        let preceded = rest[..at].chars().next_back().or(before);
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        if !preceded.is_some_and(is_ident) {
            names.insert(tail[..len].to_string());
        }
        before = tail[..len].chars().next_back();
        rest = &tail[len..];
    }
    names
}

/// The names in `referenced` that are no family of `families`. A
/// histogram's or summary's `_bucket`, `_sum` and `_count` series are
/// its family's.
fn unknown_metrics<'a>(
    referenced: impl IntoIterator<Item = &'a String>,
    families: &BTreeMap<String, String>,
) -> Vec<String> {
    referenced
        .into_iter()
        .filter(|name| {
            if families.contains_key(*name) {
                return false;
            }
            let of_family = ["_bucket", "_sum", "_count"].iter().any(|suffix| {
                name.strip_suffix(suffix)
                    .and_then(|base| families.get(base))
                    .is_some_and(|kind| {
                        kind == "histogram" || (kind == "summary" && *suffix != "_bucket")
                    })
            });
            !of_family
        })
        .cloned()
        .collect()
}

/// The label names in the `{...}` matchers (or sample labels) of `text`.
fn matcher_labels(text: &str) -> BTreeSet<String> {
    let mut labels = BTreeSet::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    let mut in_braces = false;
    let mut expect_name = false;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            continue;
        }
        match c {
            '{' => (in_braces, expect_name) = (true, true),
            '}' => (in_braces, expect_name) = (false, false),
            ',' if in_braces => expect_name = true,
            c if in_braces && expect_name && is_ident(c) => {
                let start = i;
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
                labels.insert(chars[start..i].iter().collect());
                expect_name = false;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    labels
}

/// The label names a PromQL expression (or a Grafana `label_values()`
/// query) matches on, groups by or joins on.
fn expr_labels(expr: &str) -> BTreeSet<String> {
    let mut labels = matcher_labels(expr);
    for keyword in [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ] {
        let mut from = 0;
        while let Some(at) = expr[from..].find(keyword) {
            let start = from + at;
            let end = start + keyword.len();
            from = end;
            let whole_word = !expr[..start].chars().next_back().is_some_and(is_ident)
                && !expr[end..].chars().next().is_some_and(is_ident);
            let Some(list) = expr[end..].trim_start().strip_prefix('(') else {
                continue;
            };
            if !whole_word {
                continue;
            }
            let list = &list[..list.find(')').expect("closed label list")];
            labels.extend(
                list.split(',')
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(String::from),
            );
        }
    }
    if let Some(args) = expr.trim().strip_prefix("label_values(") {
        let args = args.strip_suffix(')').expect("label_values(...)");
        if let Some((_, label)) = args.rsplit_once(',') {
            labels.insert(label.trim().to_string());
        }
    }
    labels
}

/// The values of `key:` in a YAML file, a block or folded scalar joined
/// into one line (the files here keep to that much YAML).
fn yaml_values(yaml: &str, key: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut values = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start().trim_start_matches("- ");
        let Some(value) = trimmed.strip_prefix(key).and_then(|v| v.strip_prefix(':')) else {
            continue;
        };
        let value = value.trim();
        if !matches!(value, "|" | "|-" | ">" | ">-") {
            values.push(value.trim_matches('\'').to_string());
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let block: Vec<&str> = lines[n + 1..]
            .iter()
            .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
            .map(|l| l.trim())
            .collect();
        values.push(block.join(" ").trim().to_string());
    }
    values
}

/// Every query of a Grafana dashboard: the panels' target expressions and
/// the template variables' queries.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("expr", Value::String(s)) => out.push(s.clone()),
                        ("query", Value::String(s)) if s.contains('(') => out.push(s.clone()),
                        _ => walk(value, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    out
}

/// The `{{name}}` fields of a Grafana legend.
fn legend_labels(legend: &str) -> BTreeSet<String> {
    legend
        .split("{{")
        .skip(1)
        .map(|s| s.split("}}").next().expect("}}").trim().to_string())
        .collect()
}

/// The `$labels.name` fields of alert annotations.
fn template_labels(rules: &str) -> BTreeSet<String> {
    rules
        .split("$labels.")
        .skip(1)
        .map(|s| s.chars().take_while(|&c| is_ident(c)).collect())
        .collect()
}

fn alert_names(rules: &str) -> Vec<String> {
    yaml_values(rules, "alert")
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("address").port()
}

fn http_get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").expect("send request");
    let mut all = String::new();
    s.read_to_string(&mut all).expect("read response");
    let (head, body) = all.split_once("\r\n\r\n").expect("head and body");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    body.to_string()
}

#[test]
fn the_checks_catch_names_and_labels_that_do_not_exist() {
    let text = "# HELP raidfs_a_total A.\n# TYPE raidfs_a_total counter\nraidfs_a_total{array=\"x\",mount=\"/m \\\"q\\\"\"} 1\n\
                # HELP raidfs_h H.\n# TYPE raidfs_h histogram\nraidfs_h_bucket{le=\"1\"} 1\nraidfs_h_sum 1\nraidfs_h_count 1\n";
    let fams = families(text);
    assert_eq!(fams.len(), 2, "{fams:?}");
    let refs = referenced_metrics(
        "rate(raidfs_a_total[5m]) + raidfs_h_bucket + raidfs_a_bucket + raidfs_nope; my_raidfs_x",
    );
    assert_eq!(
        refs.iter().map(String::as_str).collect::<Vec<_>>(),
        [
            "raidfs_a_bucket",
            "raidfs_a_total",
            "raidfs_h_bucket",
            "raidfs_nope"
        ]
    );
    assert_eq!(
        unknown_metrics(&refs, &fams),
        ["raidfs_a_bucket", "raidfs_nope"]
    );
    assert_eq!(
        sample_labels(text).into_iter().collect::<Vec<_>>(),
        ["array", "le", "mount"]
    );
    let labels = expr_labels(
        r#"sum by (array, uuid) (rate(x{mount=~"a,b}c", state!="x"}[5m])) * on(instance) group_left(level) y"#,
    );
    assert_eq!(
        labels.into_iter().collect::<Vec<_>>(),
        ["array", "instance", "level", "mount", "state", "uuid"]
    );
    assert_eq!(
        expr_labels(r#"label_values(raidfs_array_info{job=~"$job"}, mount)"#)
            .into_iter()
            .collect::<Vec<_>>(),
        ["job", "mount"]
    );
    let yaml = "- alert: A\n  expr: >-\n    x\n    and y\n  for: 5m\n- alert: B\n  expr: z == 1\n";
    assert_eq!(yaml_values(yaml, "expr"), ["x and y", "z == 1"]);
    assert_eq!(alert_names(yaml), ["A", "B"]);
}

#[test]
fn dashboard_and_rules_name_only_emitted_metrics_and_labels() {
    if !fuse_available() {
        return;
    }
    let m = Mirror::create();
    let _guard = DaemonGuard::new(&m.mnt);
    let port = free_port();
    check(
        m.mount_with(&format!("metrics=127.0.0.1:{port}")),
        "mount with a metrics endpoint",
    );
    common::write_synced(&m.mnt.join("f"), &common::pattern(3, 1 << 20)).expect("write");

    // What a Prometheus server scrapes, and what the textfile collector reads.
    let served = http_get(port, "/metrics");
    let printed = raidfs_ok(&[OsStr::new("metrics"), m.mnt.as_os_str()], Path::new("/"));
    let fams = families(&served);
    assert_eq!(
        fams.keys().collect::<Vec<_>>(),
        families(&printed).keys().collect::<Vec<_>>(),
        "the endpoint and `raidfs metrics` emit the same families"
    );
    assert!(fams.contains_key("raidfs_array_degraded"), "{served}");
    let mut known_labels = sample_labels(&served);
    assert!(
        ["array", "uuid", "mount", "member", "slot", "state", "action"]
            .iter()
            .all(|l| known_labels.contains(*l)),
        "{known_labels:?}\n{served}"
    );
    known_labels.extend(TARGET_LABELS.map(String::from));

    let rules = read_source(RULES);
    let rule_tests = read_source(RULE_TESTS);
    let dashboard_text = read_source(DASHBOARD);
    let dashboard: Value = serde_json::from_str(&dashboard_text).expect("dashboard JSON");
    let queries = dashboard_queries(&dashboard);
    let rule_exprs = yaml_values(&rules, "expr");
    let series = yaml_values(&rule_tests, "series");
    assert_eq!(
        rule_exprs.len(),
        alert_names(&rules).len(),
        "one expr per alert"
    );
    assert!(queries.len() >= 20, "{} dashboard queries", queries.len());
    assert!(series.len() >= 20, "{} test series", series.len());

    for (what, text) in [
        (RULES, &rules),
        (RULE_TESTS, &rule_tests),
        (DASHBOARD, &dashboard_text),
    ] {
        let refs = referenced_metrics(text);
        assert!(refs.len() >= 5, "{what} names only {refs:?}");
        let unknown = unknown_metrics(&refs, &fams);
        assert!(
            unknown.is_empty(),
            "{what} names metrics raidfs does not emit: {unknown:?}\nemitted: {:?}",
            fams.keys()
        );
    }
    let mut used_labels = BTreeMap::<String, BTreeSet<String>>::new();
    let mut note = |what: &str, labels: BTreeSet<String>| {
        for l in labels {
            used_labels.entry(l).or_default().insert(what.to_string());
        }
    };
    for q in &queries {
        note(q, expr_labels(q));
    }
    for e in rule_exprs.iter().chain(&series) {
        note(e, expr_labels(e));
    }
    note(RULES, template_labels(&rules));
    for legend in dashboard_legends(&dashboard) {
        note(&legend, legend_labels(&legend));
    }
    let unknown: Vec<_> = used_labels
        .iter()
        .filter(|(l, _)| !known_labels.contains(*l))
        .collect();
    assert!(
        unknown.is_empty(),
        "labels raidfs does not emit: {unknown:?}\nemitted: {known_labels:?}"
    );
    for label in ["array", "mount", "member", "state", "action", "job"] {
        assert!(used_labels.contains_key(label), "no file uses {label}");
    }
    m.umount();
}

fn dashboard_legends(dashboard: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("legendFormat", Value::String(s)) => out.push(s.clone()),
                        _ => walk(value, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    out
}

fn promtool(args: &[&OsStr]) -> Output {
    assert!(
        Path::new(PROMTOOL).exists(),
        "{PROMTOOL} is missing: install Debian's prometheus package (.ci/run does)"
    );
    Command::new(PROMTOOL)
        .args(args)
        .output()
        .expect("run promtool")
}

fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn promtool_accepts_the_rules_and_passes_their_tests() {
    let rules = read_source(RULES);
    let count = alert_names(&rules).len();
    assert!(count >= 7, "{count} alerts");
    let out = promtool(&[
        OsStr::new("check"),
        OsStr::new("rules"),
        source(RULES).as_os_str(),
    ]);
    let text = said(&out);
    assert!(out.status.success(), "promtool check rules:\n{text}");
    assert!(
        text.contains(&format!("SUCCESS: {count} rules found")),
        "{text}"
    );
    let out = promtool(&[
        OsStr::new("test"),
        OsStr::new("rules"),
        source(RULE_TESTS).as_os_str(),
    ]);
    let text = said(&out);
    assert!(out.status.success(), "promtool test rules:\n{text}");
    assert!(text.contains("SUCCESS"), "{text}");
}

/// `rules` with the expression of `alert` replaced by one that never
/// returns anything.
fn never_firing(rules: &str, alert: &str) -> String {
    let lines: Vec<&str> = rules.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim() == format!("- alert: {alert}"))
        .expect("the alert");
    let expr = start
        + lines[start..]
            .iter()
            .position(|l| l.trim_start().starts_with("expr:"))
            .expect("its expr");
    let indent = lines[expr].len() - lines[expr].trim_start().len();
    let end = expr
        + 1
        + lines[expr + 1..]
            .iter()
            .take_while(|l| l.len() - l.trim_start().len() > indent)
            .count();
    let mut out: Vec<String> = lines[..expr].iter().map(|l| l.to_string()).collect();
    out.push(format!("{}expr: vector(0) == 1", " ".repeat(indent)));
    out.extend(lines[end..].iter().map(|l| l.to_string()));
    out.join("\n") + "\n"
}

#[test]
fn every_alert_has_a_test_that_fires_it() {
    let rules = read_source(RULES);
    let tests = read_source(RULE_TESTS);
    let dir = tempfile::tempdir().expect("temp dir");
    let test_file = dir.path().join("raidfs.rules.test.yml");
    fs::write(&test_file, &tests).expect("write the tests");
    for alert in alert_names(&rules) {
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "no test names {alert}"
        );
        let mutated = never_firing(&rules, &alert);
        assert_ne!(mutated, rules);
        fs::write(dir.path().join("raidfs.rules.yml"), &mutated).expect("write the rules");
        let out = promtool(&[
            OsStr::new("test"),
            OsStr::new("rules"),
            test_file.as_os_str(),
        ]);
        let text = said(&out);
        assert!(
            !out.status.success() && text.contains(&format!("alertname: {alert},")),
            "the tests pass with {alert} never firing:\n{text}"
        );
    }
}

#[test]
fn dashboard_queries_are_valid_promql() {
    let dashboard: Value = serde_json::from_str(&read_source(DASHBOARD)).expect("dashboard JSON");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let queries = dashboard_queries(&dashboard);
    for (n, query) in queries.iter().enumerate() {
        // Grafana's variables as it substitutes them; label_values()
        // takes a series selector.
        let mut expr = query
            .replace("$__rate_interval", "5m")
            .replace("$job", ".*")
            .replace("$mount", ".*");
        if let Some(args) = expr.strip_prefix("label_values(") {
            expr = match args.rsplit_once(',') {
                Some((selector, _)) => selector.to_string(),
                None => args.trim_end_matches(')').to_string(),
            };
        }
        assert!(!expr.contains('$'), "an unknown variable in {query}");
        let quoted = serde_json::to_string(&expr).expect("quote");
        rules.push_str(&format!(
            "      - record: dashboard_query_{n}\n        expr: {quoted}\n"
        ));
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("dashboard.rules.yml");
    fs::write(&file, &rules).expect("write");
    let out = promtool(&[OsStr::new("check"), OsStr::new("rules"), file.as_os_str()]);
    let text = said(&out);
    assert!(out.status.success(), "{text}\n{rules}");
    assert!(
        text.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{text}"
    );
}
