//! docs/cli.md documents the whole command line: every visible subcommand,
//! each of its long options and the values they take, every mount option,
//! and every field `examine --json` prints. Checked against the clap
//! definitions and the mount option table, so the docs cannot drift.

mod ecosystem_support;

use ecosystem_support::*;

fn cli_md() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md"))
        .expect("docs/cli.md")
}

#[test]
fn every_subcommand_option_and_value_is_documented() {
    let docs = cli_md();
    let mut missing = Vec::new();
    // Subcommands and theirs (`config scan`, `bench balance`), by full name.
    let mut commands: Vec<(String, clap::Command)> = Vec::new();
    let mut pending = vec![(String::new(), raidfs::cli::command())];
    while let Some((prefix, cmd)) = pending.pop() {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            if sub.get_name() == "help" {
                continue;
            }
            let name = format!("{prefix}{}", sub.get_name());
            pending.push((format!("{name} "), sub.clone()));
            commands.push((name, sub.clone()));
        }
    }
    for (name, sub) in &commands {
        if !docs.contains(&format!("raidfs {name}")) && !docs.contains(&format!("`{name}`")) {
            missing.push(format!("subcommand {name}"));
        }
        for arg in sub.get_arguments().filter(|a| !a.is_hide_set()) {
            let Some(long) = arg.get_long() else {
                continue;
            };
            if long == "help" || long == "version" {
                continue;
            }
            if !docs.contains(&format!("--{long}")) {
                missing.push(format!("{name} --{long}"));
            }
            let values = if arg.get_action().takes_values() {
                arg.get_possible_values()
            } else {
                Vec::new()
            };
            for value in values.iter().filter(|v| !v.is_hide_set()) {
                let shown = value.get_name();
                if !docs.contains(&format!("`{shown}`")) {
                    missing.push(format!("{name} --{long} {shown}"));
                }
            }
        }
    }
    assert!(missing.is_empty(), "not in docs/cli.md: {missing:#?}");
}

#[test]
fn every_mount_option_is_documented() {
    let docs = cli_md();
    let missing: Vec<&str> = raidfs::cli::mount::options::OPTIONS
        .iter()
        .map(|(form, _)| form.split('=').next().unwrap_or(form))
        .filter(|key| !docs.contains(&format!("`{key}")))
        .collect();
    assert!(
        missing.is_empty(),
        "mount options not in docs/cli.md: {missing:?}"
    );
}

#[test]
fn every_fsck_json_field_is_documented() {
    let docs = cli_md();
    let array = Array::new();
    let out = check(
        raidfs()
            .args(["fsck", "--json", "m0.img", "m1.img", "m2.img"])
            .current_dir(array.dir.path()),
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("fsck --json");
    assert_eq!(json["result"], "clean", "{json}");
    let missing: Vec<&String> = json
        .as_object()
        .expect("an object")
        .keys()
        .filter(|key| !docs.contains(&format!("`{key}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "fsck fields not in docs/cli.md: {missing:?}"
    );
}

#[test]
fn every_bench_json_field_is_documented() {
    let docs = cli_md();
    let out = check(raidfs().args(["bench", "--kernel", "scalar", "--json"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bench --json");
    let mut all = Vec::new();
    keys(&json, &mut all);
    all.sort();
    all.dedup();
    let missing: Vec<&String> = all
        .iter()
        .filter(|key| !docs.contains(&format!("`{key}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "bench fields not in docs/cli.md: {missing:?}"
    );
}

/// Every key of a JSON document, nested ones included.
fn keys(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, inner) in map {
                out.push(key.clone());
                keys(inner, out);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| keys(i, out)),
        _ => {}
    }
}

#[test]
fn every_examine_json_field_is_documented() {
    let docs = cli_md();
    let array = Array::new();
    let out = check(
        raidfs()
            .args(["examine", "--json", "m0.img"])
            .current_dir(array.dir.path()),
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("examine --json");
    let object = json[0].as_object().expect("one object per member");
    let missing: Vec<&String> = object
        .keys()
        .filter(|key| !docs.contains(&format!("`{key}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "examine fields not in docs/cli.md: {missing:?}"
    );
}
