//! The lines docs/quickstart.md's "When something is not right" table shows are the
//! lines the examples print: each documented line below is read from the table (so an
//! edit of the docs is tested too) and matched against what the program prints for the
//! situation it describes. In the table, `<…>` and `…` stand for any text.

use std::process::{Command, Stdio};
use std::time::Duration;

use zcs_tests::{example_binary, watchdog_guard};

const QUICKSTART: &str = include_str!("../../docs/quickstart.md");

/// The first cell of the table row whose text starts with `start`, between its
/// backquotes.
fn documented(start: &str) -> &'static str {
    QUICKSTART
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .find(|l| l.starts_with(start))
        .and_then(|l| l.split('`').next())
        .unwrap_or_else(|| panic!("docs/quickstart.md has no row starting with `{start}"))
}

/// Whether `line` is `pattern` with its `<…>` and `…` standing for any text.
fn matches(pattern: &str, line: &str) -> bool {
    let mut literals = Vec::new();
    let mut rest = pattern;
    loop {
        let next = [rest.find('<'), rest.find('…')].into_iter().flatten().min();
        let Some(at) = next else {
            literals.push(rest);
            break;
        };
        literals.push(&rest[..at]);
        rest = if rest[at..].starts_with('<') {
            rest[at..].find('>').map_or("", |end| &rest[at + end + 1..])
        } else {
            &rest[at + '…'.len_utf8()..]
        };
    }
    let (first, last) = (literals[0], literals[literals.len() - 1]);
    if !line.starts_with(first) || !line.ends_with(last) || line.len() < first.len() + last.len() {
        return false;
    }
    let mut at = first.len();
    for lit in &literals[1..literals.len() - 1] {
        match line[at..].find(lit) {
            Some(i) => at += i + lit.len(),
            None => return false,
        }
    }
    at <= line.len() - last.len()
}

/// The line of `output` that starts as the documented line does.
fn printed<'a>(output: &'a str, doc: &str) -> &'a str {
    let head: String = doc.chars().take_while(|c| !matches!(c, '<' | '…')).collect();
    output.lines().find(|l| l.starts_with(&head)).unwrap_or_else(|| panic!("no line like `{doc}` in:\n{output}"))
}

fn run(name: &str, args: &[&str]) -> String {
    let out = Command::new(example_binary(name))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn the_matcher_takes_placeholders_for_any_text() {
    assert!(matches("error: <file> line <line>: <key>: …", "error: a.json5 line 3: pool.x: bad"));
    assert!(matches("[sub] waiting for a publisher on '<key>'…", "[sub] waiting for a publisher on 'demo/x'…"));
    assert!(!matches("error: <file> line <line>: …", "error: a.json5:3:7: pool.x"));
    assert!(!matches("a <x> b", "a b"));
}

#[test]
fn documented_errors_are_what_the_examples_print() {
    let _w = watchdog_guard("documented_errors_are_what_the_examples_print", Duration::from_secs(120));
    let dir = std::env::temp_dir().join(format!("zcs-doc-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // A value of our configuration that is refused.
    let bad = dir.join("zcs.json5");
    std::fs::write(&bad, "{\n  device: \"host\",\n  pool: { max_blocks: -3 },\n}\n").unwrap();
    let out = run("z_cuda_sub", &["--zcs-config", bad.to_str().unwrap(), "-n", "1"]);
    let doc = documented("error: invalid configuration:");
    let line = printed(&out, doc);
    assert!(matches(doc, line), "documented `{doc}`, printed `{line}`");
    assert!(line.contains(&format!("{} line 3: pool.max_blocks:", bad.display())), "{line}");

    // Our configuration given to -c, which takes Zenoh's.
    let ours = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/config.json5");
    let out = run("z_cuda_sub", &["-c", ours, "-n", "1"]);
    let doc = documented("error: … is a zenoh-cuda-shm configuration");
    let line = printed(&out, "error: ");
    assert!(matches(doc, line), "documented `{doc}`, printed `{line}`");

    // A listen port another process holds: Zenoh's words, without its source files.
    let taken = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let endpoint = format!("tcp/127.0.0.1:{}", taken.local_addr().unwrap().port());
    let out = run("z_cuda_sub", &["--device", "host", "--no-multicast-scouting", "-l", &endpoint, "-n", "1"]);
    let doc = documented("error: opening the Zenoh session failed:");
    let line = printed(&out, doc);
    assert!(matches(doc, line), "documented `{doc}`, printed `{line}`");
    assert!(!line.contains(".rs:"), "a source location in `{line}`");
    drop(taken);

    // A subscriber with no publisher, ended after its 2 s notice.
    let out = run(
        "z_cuda_sub",
        &["--device", "host", "--no-multicast-scouting", "-l", "tcp/127.0.0.1:0", "-k", "zcs-test/doc/none", "-n", "1"]
            .into_iter()
            .chain(["--idle-timeout", "3"])
            .collect::<Vec<_>>(),
    );
    let doc = documented("[sub] waiting for a publisher on");
    let line = printed(&out, doc);
    assert!(matches(doc, line), "documented `{doc}`, printed `{line}`");

    // A publisher that sends two messages and exits: the subscriber says so 5 s later.
    let port = zcs_tests::free_tcp_port().to_string();
    let (listen, connect) = (format!("tcp/127.0.0.1:{port}"), format!("tcp/127.0.0.1:{port}"));
    let key = "zcs-test/doc/silence";
    let sub = Command::new(example_binary("z_cuda_sub"))
        .args(["--device", "host", "--no-multicast-scouting", "-l", &listen, "-k", key, "-n", "10"])
        .args(["--idle-timeout", "8"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The publisher waits for the subscriber (which may still be starting on a loaded
    // machine): its two messages must reach it.
    let published = run(
        "z_cuda_pub",
        &["--device", "host", "--no-multicast-scouting", "-e", &connect, "-k", key, "-n", "2", "--wait-zero-copy", "1"],
    );
    let out = sub.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let doc = documented("[sub] nothing for 5 s after");
    let line = printed(&out, doc);
    assert!(matches(doc, line), "documented `{doc}`, printed `{line}`");
    assert!(line.contains(" after 2 messages;"), "{line}\npublisher:\n{published}");
    let _ = std::fs::remove_dir_all(&dir);
}
