//! The bridge's command line: what it refuses, and how. (Pub/sub through the bridge,
//! and its admin space, are tested in `tests/tests/plugin.rs`.)

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};

fn bridge(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zenoh-bridge-cuda-shm"))
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("run zenoh-bridge-cuda-shm")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn help_lists_zenohd_style_flags() {
    let out = bridge(&["--help"]);
    assert!(out.status.success(), "{}", text(&out));
    let help = text(&out);
    for flag in ["--config", "--listen", "--connect", "--rest-http-port", "--no-multicast-scouting"] {
        assert!(help.contains(flag), "--help does not mention {flag}:\n{help}");
    }
}

/// A bad plugin section stops the bridge before it opens anything: exit status 1 and the
/// plugin's message naming the key, not a panic or a signal.
#[test]
fn bad_plugin_section_is_refused_with_its_key() {
    let dir = std::env::temp_dir().join(format!("zcs-bridge-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (section, expected) in [
        ("{ max_entries: 0 }", "plugins/cuda_shm: max_entries: 0 is out of range (1 to 1048576)"),
        ("{ max_entires: 10 }", "plugins/cuda_shm: unknown field `max_entires`"),
        (
            "{ max_entries: \"ten\" }",
            "plugins/cuda_shm: max_entries: expected a whole number from 1 to 1048576, found the string \"ten\"",
        ),
    ] {
        let path = dir.join("bad.json5");
        std::fs::write(&path, format!("{{ plugins: {{ cuda_shm: {section} }} }}")).unwrap();
        let out = bridge(&["-c", path.to_str().unwrap(), "--no-multicast-scouting", "-l", "tcp/127.0.0.1:0"]);
        assert_eq!(out.status.signal(), None, "killed by a signal: {}", text(&out));
        assert_eq!(out.status.code(), Some(1), "{section}: {}", text(&out));
        assert!(text(&out).contains(expected), "{section}: expected {expected:?} in:\n{}", text(&out));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unreadable_config_file_is_an_error() {
    let out = bridge(&["-c", "/nonexistent/zcs-bridge.json5"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("/nonexistent/zcs-bridge.json5"), "{}", text(&out));
}
