//! The report of one benchmark run, built from the JSON lines the benchmarks printed.
//!
//! Reads every `*.jsonl` file of a run folder (`scripts/gpu-run.sh` writes one per
//! program: `zcs_pool_bench`, `zcs_latency`, `zcs_throughput`, `zcs_zenoh_shm` and the
//! Python anchors of `bench/python/`) and an optional `machine.txt` (nvidia-smi CSV),
//! then writes into an output folder:
//!
//! - `report.md`: the goals of the benchmark suite, each computed from this run and
//!   marked met / not met / not measured, then Markdown tables: latency per path and
//!   size, the Python anchors, the device-to-device copy reference, throughput,
//!   first message to a new subscriber and the pool micro-benchmarks;
//! - `latency.png`: one-way latency p50 against payload size, log-log, one line per
//!   path, with the 64-byte plain Zenoh message as reference lines;
//! - `throughput.png`: msgs/s per path, bars grouped by subscriber count, one panel per
//!   frame size;
//! - `run.json`: every record of the run in one document (`records`, `machine`, the
//!   computed `goals` and the `warnings`).
//!
//! A line that is not a JSON object (a `SKIPPED …` line, a cut-off write) is skipped
//! with a warning, on stderr and in the report. A row a benchmark skipped on purpose
//! (a `skipped` field with the reason) is listed under its table. A figure the run does
//! not hold is reported as not measured, never filled in. Paths named `zenoh-…` are
//! Zenoh's own (plain or its shared memory), the others ours.
//!
//! ```text
//! zcs_report gpu-out                        # writes gpu-out/report/
//! zcs_report gpu-out /tmp/report --font /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use plotters::prelude::*;
use plotters::style::FontStyle;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::{Map, Value, json};

#[derive(Parser, Debug)]
#[command(
    about = "zenoh-cuda-shm benchmark report: Markdown tables, PNG plots and one JSON file from a run's JSON lines"
)]
struct Args {
    /// Folder holding the run's `*.jsonl` files (and `machine.txt`, if any).
    run: PathBuf,
    /// Output folder (default: `<run>/report`).
    out: Option<PathBuf>,
    /// TrueType font for the plots' text.
    #[arg(long, default_value = DEFAULT_FONT)]
    font: PathBuf,
}

const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const FRAME_1080P_RGB: u64 = zcs_bench::frames::FRAME_1080P_RGB as u64;
const FRAME_4K_RGBA: u64 = zcs_bench::frames::FRAME_4K_RGBA as u64;
/// The payload of `zcs_latency`'s plain Zenoh row.
const PLAIN_SIZE: u64 = 64;
/// The size at which the copy paths are compared with zero-copy.
const COPY_SIZE: u64 = 32 << 20;
const ZERO_COPY: &str = "zero-copy";
const ZERO_COPY_PROVIDER: &str = "zero-copy-provider";
const ZERO_COPY_ZENOHD: &str = "zero-copy-zenohd";
const PLAIN: &str = "zenoh-plain";
const ZERO_COPY_PEER: &str = "zero-copy-peer";
const PEER_COPY: &str = "peer-copy";
/// `zcs_peer_bench`: GPU 1 reading GPU 0's block in place, and the raw peer copy.
const PEER_READ: &str = "zero-copy-peer-read";
const PEER_COPY_RAW: &str = "peer-copy-raw";
/// `zcs_latency`: a CPU consumer reading the publisher's host copy, and the reference,
/// one pinned device→host copy.
const HOST_BLOCK: &str = "host-block";
/// `zcs_latency --peer-host`: a GPU consumer without peer access, through a host block.
const HOST_COPY: &str = "host-copy";
const D2H_PINNED: &str = "d2h-pinned";
/// `zcs_throughput --remote-netns`: our GPU frames to a CUDA subscriber on another host
/// (a network namespace over veth), and what Zenoh carries for host payloads there.
const CROSS_HOST: &str = "cross-host";
const ZENOH_HOST_CROSS_HOST: &str = "zenoh-host-cross-host";

/// Whether a path is ours, not Zenoh's own (`zenoh-plain`, `zenoh-shm`, `zenoh-pinned`, …).
fn is_ours(path: &str) -> bool {
    !path.starts_with("zenoh-")
}

/// Zero-copy p50 ÷ 64-byte plain Zenoh p50, at most.
const GOAL_FLAT_P50: f64 = 1.2;
/// Zero-copy p99 ÷ 64-byte plain Zenoh p99, at most.
const GOAL_FLAT_P99: f64 = 2.0;
/// Best copy path p50 ÷ zero-copy p50 at 32 MiB, at least.
const GOAL_COPY_RATIO: f64 = 50.0;
/// 4K RGBA msgs/s to one subscriber, and to each of four, at least.
const GOAL_4K_ONE: f64 = 5000.0;
const GOAL_4K_FOUR: f64 = 2000.0;
/// First message to a new subscriber, p50, at most (µs).
const GOAL_FIRST_US: f64 = 1000.0;
/// Zero-copy with blocks lent by a provider ÷ with the publisher's own pool, p50, at most.
const GOAL_PROVIDER_RATIO: f64 = 1.1;
/// torch.multiprocessing round trip ÷ ours, at least.
const GOAL_TORCH_RATIO: f64 = 10.0;
/// Zero-copy to a peer GPU ÷ on the same GPU, p50, at most.
const GOAL_PEER_RATIO: f64 = 1.2;
/// The in-place read across the link ÷ the raw peer copy's bandwidth, at least, from
/// `COPY_SIZE` up (below it launch and host timing dominate both).
const GOAL_PEER_READ: f64 = 0.8;
/// A host block ready for a CPU consumer (publication to read, measured one way) ÷ one
/// pinned device→host copy of the same size, at `COPY_SIZE`, at most.
const GOAL_HOST_BLOCK: f64 = 1.3;
/// Our GPU frames across hosts ÷ Zenoh's host payloads of the same size over the same
/// link, msgs/s, at least.
const GOAL_CROSS_HOST: f64 = 0.7;

// ---------------------------------------------------------------------------------
// Reading a run
// ---------------------------------------------------------------------------------

/// One JSON object printed by a benchmark.
#[derive(Debug, Clone)]
struct Record {
    /// The file it came from (`zcs_latency.jsonl`).
    file: String,
    fields: Map<String, Value>,
}

impl Record {
    fn str(&self, key: &str) -> Option<&str> {
        self.fields.get(key)?.as_str()
    }

    /// A finite number (null, NaN and strings are not numbers).
    fn num(&self, key: &str) -> Option<f64> {
        self.fields.get(key)?.as_f64().filter(|v| v.is_finite())
    }

    fn uint(&self, key: &str) -> Option<u64> {
        let v = self.fields.get(key)?;
        v.as_u64().or_else(|| v.as_f64().filter(|f| *f >= 0.0 && f.fract() == 0.0).map(|f| f as u64))
    }

    fn bench(&self) -> &str {
        self.str("bench").unwrap_or("")
    }
}

/// The machine line: nvidia-smi's CSV header and first row, as pairs.
#[derive(Debug, Clone, PartialEq)]
struct Machine {
    fields: Vec<(String, String)>,
    text: String,
}

/// Everything read from a run folder.
#[derive(Debug, Default)]
struct Run {
    /// `(file name, lines)` of each `*.jsonl` file, sorted by name.
    files: Vec<(String, usize)>,
    records: Vec<Record>,
    machine: Option<Machine>,
    warnings: Vec<String>,
}

/// Python writes NaN and ±Infinity as bare words, which are not JSON: read them as null.
fn non_finite_to_null(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let (mut in_str, mut escaped) = (false, false);
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        if in_str {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_str = false;
            }
        } else if c == '"' {
            in_str = true;
        } else if let Some(word) = ["-Infinity", "Infinity", "NaN"].into_iter().find(|w| rest.starts_with(w)) {
            out.push_str("null");
            rest = &rest[word.len()..];
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

fn excerpt(line: &str) -> String {
    let mut s: String = line.chars().take(60).collect();
    if s.len() < line.len() {
        s.push('…');
    }
    s
}

/// The JSON objects of one file; every other non-empty line becomes a warning.
fn parse_jsonl(file: &str, text: &str, warnings: &mut Vec<String>) -> Vec<Record> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let parsed = serde_json::from_str::<Value>(line)
            .or_else(|e| serde_json::from_str::<Value>(&non_finite_to_null(line)).map_err(|_| e));
        match parsed {
            Ok(Value::Object(fields)) => out.push(Record { file: file.to_owned(), fields }),
            Ok(_) => warnings.push(format!("{file}:{}: JSON but not an object, skipped: {}", i + 1, excerpt(line))),
            Err(_) => warnings.push(format!("{file}:{}: not a JSON object, skipped: {}", i + 1, excerpt(line))),
        }
    }
    out
}

/// nvidia-smi `--format=csv`: a header line, then one line per GPU (the first is kept).
fn parse_machine(text: &str) -> Machine {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let fields = match (lines.next(), lines.next()) {
        (Some(h), Some(v)) if h.contains(',') && v.contains(',') => {
            h.split(',').map(str::trim).zip(v.split(',').map(str::trim)).map(|(k, v)| (k.into(), v.into())).collect()
        }
        _ => Vec::new(),
    };
    Machine { fields, text: text.to_owned() }
}

fn load_run(dir: &Path) -> Result<Run, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".jsonl"))
        .collect();
    names.sort();
    let mut run = Run::default();
    for name in names {
        let text =
            std::fs::read_to_string(dir.join(&name)).map_err(|e| format!("{}: {e}", dir.join(&name).display()))?;
        let recs = parse_jsonl(&name, &text, &mut run.warnings);
        run.files.push((name, recs.len()));
        run.records.extend(recs);
    }
    if let Ok(text) = std::fs::read_to_string(dir.join("machine.txt")) {
        run.machine = Some(parse_machine(&text));
    }
    Ok(run)
}

// ---------------------------------------------------------------------------------
// Aggregation
// ---------------------------------------------------------------------------------

/// One latency row at one size (µs).
#[derive(Debug, Clone, Copy, PartialEq)]
struct LatCell {
    /// Round trip / 2.
    p50: f64,
    p99: Option<f64>,
    /// The one-way latency the receiver measured itself (`measured_one_way_*`).
    measured_p50: Option<f64>,
    measured_p99: Option<f64>,
    rtt_p50: f64,
    n: Option<u64>,
}

/// A latency path over sizes.
#[derive(Debug, Clone)]
struct LatRow {
    path: String,
    backend: String,
    /// From a Python anchor script (its setup row names the `script`).
    anchor: bool,
    cells: BTreeMap<u64, LatCell>,
}

/// A device-to-device copy, per size: (p50 µs, p99 µs, GB/s at p50).
#[derive(Debug, Clone)]
struct D2dRow {
    label: String,
    /// The plot legend's label.
    short: String,
    cells: BTreeMap<u64, (f64, Option<f64>, Option<f64>)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct TputCell {
    msgs: f64,
    gbps: Option<f64>,
    pub_cpu: Option<f64>,
    sub_cpu: Option<f64>,
    errors: Option<u64>,
    lost: Option<u64>,
}

/// A throughput path, per (frame size, subscribers).
#[derive(Debug, Clone)]
struct TputRow {
    path: String,
    cells: BTreeMap<(u64, u64), TputCell>,
}

/// A `zcs_peer_bench` row, per size: (p50 µs, p99 µs).
#[derive(Debug, Clone)]
struct PeerRow {
    path: String,
    cells: BTreeMap<u64, (f64, Option<f64>)>,
}

/// A pool micro-benchmark, per size: (p50 ns, p99 ns, n).
#[derive(Debug, Clone)]
struct PoolRow {
    bench: String,
    backend: String,
    cells: BTreeMap<u64, (f64, Option<f64>, Option<u64>)>,
}

/// The run, sorted into what the tables and plots show.
#[derive(Debug, Default)]
struct Data {
    latency: Vec<LatRow>,
    d2d: Vec<D2dRow>,
    throughput: Vec<TputRow>,
    first: Vec<Record>,
    pool: Vec<PoolRow>,
    peer: Vec<PeerRow>,
    /// Setup rows (`*-setup`, `device`).
    setups: Vec<Record>,
    /// Rows a benchmark printed for an error (`*-error`).
    errors: Vec<Record>,
    /// `latency` and `throughput` rows a benchmark skipped, with a `skipped` reason.
    skipped: Vec<Record>,
}

impl Data {
    fn lat(&self, path: &str, anchor: bool) -> Option<&LatRow> {
        self.latency.iter().find(|r| r.path == path && r.anchor == anchor)
    }

    fn tput(&self, path: &str, size: u64, subs: u64) -> Option<&TputCell> {
        self.throughput.iter().find(|r| r.path == path)?.cells.get(&(size, subs))
    }
}

fn row_mut<T>(rows: &mut Vec<T>, is: impl Fn(&T) -> bool, new: impl FnOnce() -> T) -> &mut T {
    match rows.iter().position(is) {
        Some(i) => &mut rows[i],
        None => {
            rows.push(new());
            rows.last_mut().expect("pushed")
        }
    }
}

fn insert_once<K: Ord + std::fmt::Debug, V>(
    cells: &mut BTreeMap<K, V>,
    key: K,
    v: V,
    what: &str,
    warnings: &mut Vec<String>,
) {
    match cells.entry(key) {
        std::collections::btree_map::Entry::Occupied(e) => {
            warnings.push(format!("{what} at {:?} appears twice; the first row is kept", e.key()))
        }
        std::collections::btree_map::Entry::Vacant(e) => {
            e.insert(v);
        }
    }
}

fn aggregate(records: &[Record], warnings: &mut Vec<String>) -> Data {
    let anchor_files: BTreeSet<&str> =
        records.iter().filter(|r| r.fields.contains_key("script")).map(|r| r.file.as_str()).collect();
    let mut d = Data::default();
    for r in records {
        let bench = r.bench();
        let size = r.uint("size");
        let path = r.str("path").unwrap_or("").to_owned();
        let missing = |what: &str| format!("{}: a `{bench}` row without {what}, skipped", r.file);
        if matches!(bench, "latency" | "throughput") && r.str("skipped").is_some() {
            d.skipped.push(r.clone());
            continue;
        }
        match bench {
            "latency" => {
                let (Some(size), Some(p50)) = (size, r.num("one_way_p50_us")) else {
                    warnings.push(missing("size or one_way_p50_us"));
                    continue;
                };
                let anchor = anchor_files.contains(r.file.as_str());
                let cell = LatCell {
                    p50,
                    p99: r.num("one_way_p99_us"),
                    measured_p50: r.num("measured_one_way_p50_us"),
                    measured_p99: r.num("measured_one_way_p99_us"),
                    rtt_p50: r.num("rtt_p50_us").unwrap_or(2.0 * p50),
                    n: r.uint("n"),
                };
                let row = row_mut(
                    &mut d.latency,
                    |x| x.path == path && x.anchor == anchor,
                    || LatRow {
                        path: path.clone(),
                        backend: r.str("backend").unwrap_or("").into(),
                        anchor,
                        cells: BTreeMap::new(),
                    },
                );
                insert_once(&mut row.cells, size, cell, &format!("latency `{path}`"), warnings);
            }
            "d2d-copy" => {
                // Python (d2d_reference.py): CUDA events; zcs_throughput: host clock.
                let (label, short, p50, p99, gbps) = if r.fields.contains_key("event_p50_us") {
                    let backend = r.str("backend").unwrap_or("?");
                    let label = format!("{backend} `{}` (CUDA events, {})", r.str("op").unwrap_or("copy"), r.file);
                    let short = format!("D2D copy, {backend} (CUDA events)");
                    (label, short, r.num("event_p50_us"), r.num("event_p99_us"), r.num("gbps_p50"))
                } else {
                    let label = format!("`cuMemcpyDtoDAsync` + synchronize (host clock, {})", r.file);
                    let short = "D2D copy, cuMemcpyDtoD (host clock)".to_owned();
                    (label, short, r.num("p50_us"), r.num("p99_us"), r.num("gb_per_s"))
                };
                let (Some(size), Some(p50)) = (size, p50) else {
                    warnings.push(missing("size or p50"));
                    continue;
                };
                let row = row_mut(
                    &mut d.d2d,
                    |x| x.label == label,
                    || D2dRow { label: label.clone(), short, cells: BTreeMap::new() },
                );
                insert_once(&mut row.cells, size, (p50, p99, gbps), &format!("D2D {label}"), warnings);
            }
            "throughput" => {
                let (Some(size), Some(subs), Some(msgs)) = (size, r.uint("subscribers"), r.num("msgs_per_s")) else {
                    warnings.push(missing("size, subscribers or msgs_per_s"));
                    continue;
                };
                let cell = TputCell {
                    msgs,
                    gbps: r.num("gb_per_s"),
                    pub_cpu: r.num("pub_cpu_us_per_msg"),
                    sub_cpu: r.num("sub_cpu_us_per_msg"),
                    errors: r.uint("errors"),
                    lost: r.uint("lost"),
                };
                let row = row_mut(
                    &mut d.throughput,
                    |x| x.path == path,
                    || TputRow { path: path.clone(), cells: BTreeMap::new() },
                );
                insert_once(&mut row.cells, (size, subs), cell, &format!("throughput `{path}`"), warnings);
            }
            "peer-bandwidth" => {
                let (Some(size), Some(p50)) = (size, r.num("p50_us")) else {
                    warnings.push(missing("size or p50_us"));
                    continue;
                };
                let row =
                    row_mut(&mut d.peer, |x| x.path == path, || PeerRow { path: path.clone(), cells: BTreeMap::new() });
                insert_once(&mut row.cells, size, (p50, r.num("p99_us")), &format!("peer `{path}`"), warnings);
            }
            "first-message" => d.first.push(r.clone()),
            "device" => d.setups.push(r.clone()),
            b if b.ends_with("-setup") => d.setups.push(r.clone()),
            b if b.ends_with("-error") => d.errors.push(r.clone()),
            b if r.fields.contains_key("p50_ns") || r.fields.contains_key("ns") => {
                let (Some(size), Some(p50)) = (size, r.num("p50_ns").or_else(|| r.num("ns"))) else {
                    warnings.push(missing("size"));
                    continue;
                };
                let backend = r.str("backend").unwrap_or("").to_owned();
                let row = row_mut(
                    &mut d.pool,
                    |x| x.bench == b && x.backend == backend,
                    || PoolRow { bench: b.into(), backend: backend.clone(), cells: BTreeMap::new() },
                );
                insert_once(&mut row.cells, size, (p50, r.num("p99_ns"), r.uint("n")), &format!("`{b}`"), warnings);
            }
            other => warnings.push(format!("{}: unknown row `bench: {other}`, not in the tables", r.file)),
        }
    }
    d
}

// ---------------------------------------------------------------------------------
// Goals
// ---------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Met,
    NotMet,
    NotMeasured,
}

impl Status {
    fn text(self) -> &'static str {
        match self {
            Status::Met => "**met**",
            Status::NotMet => "**not met**",
            Status::NotMeasured => "not measured",
        }
    }

    fn word(self) -> &'static str {
        match self {
            Status::Met => "met",
            Status::NotMet => "not met",
            Status::NotMeasured => "not measured",
        }
    }

    /// Met when every check passes; not measured when there is none.
    fn of(checks: &[bool]) -> Status {
        match checks {
            [] => Status::NotMeasured,
            c if c.iter().all(|&ok| ok) => Status::Met,
            _ => Status::NotMet,
        }
    }
}

#[derive(Debug, Clone)]
struct Goal {
    goal: String,
    target: String,
    measured: String,
    status: Status,
}

impl Goal {
    fn new(goal: &str, target: &str, measured: String, status: Status) -> Self {
        Goal { goal: goal.into(), target: target.into(), measured, status }
    }

    fn not_measured(goal: &str, target: &str, why: &str) -> Self {
        Self::new(goal, target, format!("not measured ({why})"), Status::NotMeasured)
    }
}

/// Which figure of a latency cell a goal compares.
#[derive(Debug, Clone, Copy)]
enum Stat {
    P50,
    P99,
    MeasuredP50,
    MeasuredP99,
}

impl Stat {
    fn of(self, c: &LatCell) -> Option<f64> {
        match self {
            Stat::P50 => Some(c.p50),
            Stat::P99 => c.p99,
            Stat::MeasuredP50 => c.measured_p50,
            Stat::MeasuredP99 => c.measured_p99,
        }
    }
}

/// Zero-copy at each size ÷ the 64-byte plain Zenoh message, same figure.
fn goal_flat(d: &Data, stat: Stat, goal: &str, max: f64) -> Goal {
    let target = format!("≤ {max}× at every size");
    let Some(plain) = d.lat(PLAIN, false).and_then(|r| r.cells.get(&PLAIN_SIZE)) else {
        return Goal::not_measured(goal, &target, "no 64 B `zenoh-plain` row");
    };
    let Some(plain) = stat.of(plain) else {
        return Goal::not_measured(goal, &target, "the 64 B `zenoh-plain` row lacks this figure");
    };
    let Some(zc) = d.lat(ZERO_COPY, false) else {
        return Goal::not_measured(goal, &target, "no `zero-copy` latency row");
    };
    let (mut parts, mut checks) = (Vec::new(), Vec::new());
    for (&size, c) in &zc.cells {
        match stat.of(c) {
            Some(v) => {
                let ratio = v / plain;
                checks.push(ratio <= max);
                parts.push(format!("{} {}", human_size(size), fmt_ratio(ratio)));
            }
            None => parts.push(format!("{} not measured", human_size(size))),
        }
    }
    if checks.is_empty() {
        return Goal::not_measured(goal, &target, "no `zero-copy` figure");
    }
    Goal::new(goal, &target, format!("{} (÷ {} µs)", parts.join(", "), fmt_num(plain)), Status::of(&checks))
}

/// Zero-copy with lent blocks ÷ with own blocks, p50 (RTT/2), at every size both rows
/// have: blocks of the zenohd plugin if the run has them, else of a provider process.
fn goal_provider(d: &Data) -> Goal {
    let goal = "Zero-copy with a provider's blocks ÷ own pool, p50, one way = RTT/2";
    let target = format!("≤ {GOAL_PROVIDER_RATIO}× at every size");
    let lent = d.lat(ZERO_COPY_ZENOHD, false).or_else(|| d.lat(ZERO_COPY_PROVIDER, false));
    let (Some(own), Some(lent)) = (d.lat(ZERO_COPY, false), lent) else {
        return Goal::not_measured(
            goal,
            &target,
            "needs `zero-copy` and `zero-copy-zenohd` or `zero-copy-provider` rows",
        );
    };
    match p50_ratios(lent, own, GOAL_PROVIDER_RATIO) {
        Some((parts, checks)) => Goal::new(goal, &target, format!("`{}`: {parts}", lent.path), Status::of(&checks)),
        None => Goal::not_measured(goal, &target, "no size in both rows"),
    }
}

/// `row` ÷ `base`, p50 (RTT/2), at every size both have: the ratios in words, and
/// whether each is at most `max`; `None` if they share no size.
fn p50_ratios(row: &LatRow, base: &LatRow, max: f64) -> Option<(String, Vec<bool>)> {
    let (mut parts, mut checks) = (Vec::new(), Vec::new());
    for (&size, r) in &row.cells {
        if let Some(b) = base.cells.get(&size) {
            let ratio = r.p50 / b.p50;
            checks.push(ratio <= max);
            parts.push(format!("{} {}", human_size(size), fmt_ratio(ratio)));
        }
    }
    (!checks.is_empty()).then(|| (parts.join(", "), checks))
}

/// The best copy path at 32 MiB ÷ zero-copy at 32 MiB (p50, RTT/2).
fn goal_copy(d: &Data) -> Goal {
    let goal = "Best copy path ÷ zero-copy, 32 MiB, p50";
    let target = format!("≥ {GOAL_COPY_RATIO}×");
    let Some(zc) = d.lat(ZERO_COPY, false).and_then(|r| r.cells.get(&COPY_SIZE)) else {
        return Goal::not_measured(goal, &target, "no 32 MiB `zero-copy` row");
    };
    let best = d
        .latency
        .iter()
        // `peer-copy` and `host-copy` serve a subscriber on another GPU, and `host-block`
        // one without GPU memory: none is the same-GPU consumer's copy path; `d2h-pinned`
        // is a bare copy, no path at all.
        .filter(|r| !r.anchor && !r.path.starts_with(ZERO_COPY) && r.path != PLAIN)
        .filter(|r| ![PEER_COPY, HOST_COPY, HOST_BLOCK, D2H_PINNED].contains(&r.path.as_str()))
        .filter_map(|r| r.cells.get(&COPY_SIZE).map(|c| (r.path.as_str(), c.p50)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    let Some((path, copy)) = best else {
        return Goal::not_measured(goal, &target, "no 32 MiB copy-path row");
    };
    let ratio = copy / zc.p50;
    let measured = format!("`{path}` {} µs ÷ `zero-copy` {} µs = {}", fmt_num(copy), fmt_num(zc.p50), fmt_ratio(ratio));
    Goal::new(goal, &target, measured, Status::of(&[ratio >= GOAL_COPY_RATIO]))
}

/// A host block ready for a CPU consumer ÷ one pinned device→host copy, at 32 MiB, from
/// the measured one-way p50 (publication to the consumer's read; the copy's own time),
/// with the other sizes shown.
fn goal_host_block(d: &Data) -> Goal {
    let goal = "Host block ready for a CPU consumer ÷ one pinned D2H copy, p50, measured one way";
    let target = format!("≤ {GOAL_HOST_BLOCK}× at {}", human_size(COPY_SIZE));
    let (Some(hb), Some(d2h)) = (d.lat(HOST_BLOCK, false), d.lat(D2H_PINNED, false)) else {
        return Goal::not_measured(goal, &target, "needs `host-block` and `d2h-pinned` rows");
    };
    let (mut parts, mut at_goal) = (Vec::new(), None);
    for (&size, c) in &hb.cells {
        let (Some(h), Some(r)) = (c.measured_p50, d2h.cells.get(&size).and_then(|r| r.measured_p50)) else { continue };
        let ratio = h / r;
        parts.push(format!("{} {}", human_size(size), fmt_ratio(ratio)));
        if size == COPY_SIZE {
            at_goal = Some(ratio);
        }
    }
    match at_goal {
        Some(ratio) => Goal::new(goal, &target, parts.join(", "), Status::of(&[ratio <= GOAL_HOST_BLOCK])),
        None => Goal::not_measured(goal, &target, "no 32 MiB size in both rows"),
    }
}

/// GPU frames to a CUDA subscriber on another host ÷ Zenoh's host payloads over the same
/// link, msgs/s, at every frame size and subscriber count both rows have.
fn goal_cross_host(d: &Data) -> Goal {
    let goal = "GPU frames across hosts ÷ Zenoh's host payloads over the same link, msgs/s";
    let target = format!("≥ {:.0} % at every size", GOAL_CROSS_HOST * 100.0);
    let find = |path: &str| d.throughput.iter().find(|r| r.path == path);
    let (Some(ours), Some(link)) = (find(CROSS_HOST), find(ZENOH_HOST_CROSS_HOST)) else {
        return Goal::not_measured(goal, &target, "needs `cross-host` and `zenoh-host-cross-host` rows");
    };
    let (mut parts, mut checks) = (Vec::new(), Vec::new());
    for (&(size, subs), c) in &ours.cells {
        let Some(l) = link.cells.get(&(size, subs)) else { continue };
        let share = c.msgs / l.msgs;
        checks.push(share >= GOAL_CROSS_HOST);
        parts.push(format!(
            "{} × {subs}: {:.0} % ({} of {})",
            frame_label(size),
            share * 100.0,
            fmt_num(c.msgs),
            fmt_num(l.msgs)
        ));
    }
    if checks.is_empty() {
        return Goal::not_measured(goal, &target, "`cross-host` and `zenoh-host-cross-host` share no cell");
    }
    Goal::new(goal, &target, parts.join(", "), Status::of(&checks))
}

/// Zero-copy to a subscriber on another GPU ÷ on the same GPU, p50 (RTT/2), at every size
/// both rows have.
fn goal_peer_latency(d: &Data) -> Goal {
    let goal = "Zero-copy to a peer GPU ÷ same GPU, p50, one way = RTT/2";
    let target = format!("≤ {GOAL_PEER_RATIO}× at every size");
    let (Some(same), Some(peer)) = (d.lat(ZERO_COPY, false), d.lat(ZERO_COPY_PEER, false)) else {
        return Goal::not_measured(goal, &target, "needs `zero-copy` and `zero-copy-peer` rows");
    };
    match p50_ratios(peer, same, GOAL_PEER_RATIO) {
        Some((parts, checks)) => Goal::new(goal, &target, parts, Status::of(&checks)),
        None => Goal::not_measured(goal, &target, "`zero-copy` and `zero-copy-peer` share no size"),
    }
}

/// The in-place read across the link as a share of the raw peer copy's bandwidth (the
/// copy's p50 ÷ the read's), judged from `COPY_SIZE` up and shown at every size.
fn goal_peer_read(d: &Data) -> Goal {
    let goal = "In-place read across the link ÷ raw peer copy, bandwidth at p50";
    let target = format!("≥ {:.0} % from {}", GOAL_PEER_READ * 100.0, human_size(COPY_SIZE));
    let find = |path: &str| d.peer.iter().find(|r| r.path == path);
    let (Some(read), Some(raw)) = (find(PEER_READ), find(PEER_COPY_RAW)) else {
        return Goal::not_measured(goal, &target, "needs `zero-copy-peer-read` and `peer-copy-raw` rows");
    };
    let (mut parts, mut checks) = (Vec::new(), Vec::new());
    for (&size, &(read_us, _)) in &read.cells {
        if let Some(&(raw_us, _)) = raw.cells.get(&size) {
            let share = raw_us / read_us;
            if size >= COPY_SIZE {
                checks.push(share >= GOAL_PEER_READ);
            }
            parts.push(format!("{} {:.0} %", human_size(size), share * 100.0));
        }
    }
    if checks.is_empty() {
        return Goal::not_measured(goal, &target, "no size from 32 MiB in both rows");
    }
    Goal::new(goal, &target, parts.join(", "), Status::of(&checks))
}

/// 4K RGBA frames to one subscriber on another GPU, read in place or copied on arrival.
fn goal_4k_peer(d: &Data) -> Goal {
    let goal = "4K RGBA msgs/s to 1 subscriber on a peer GPU";
    let target = format!("≥ {}", fmt_num(GOAL_4K_ONE));
    let rows: Vec<(&str, f64)> = [ZERO_COPY_PEER, PEER_COPY]
        .into_iter()
        .filter_map(|p| d.tput(p, FRAME_4K_RGBA, 1).map(|c| (p, c.msgs)))
        .collect();
    if rows.is_empty() {
        return Goal::not_measured(goal, &target, "no 4K RGBA `zero-copy-peer` or `peer-copy` row");
    }
    let measured = rows.iter().map(|(p, m)| format!("`{p}` {}", fmt_num(*m))).collect::<Vec<_>>().join(", ");
    Goal::new(goal, &target, measured, Status::of(&rows.iter().map(|r| r.1 >= GOAL_4K_ONE).collect::<Vec<_>>()))
}

fn goal_4k(d: &Data, subs: u64, min: f64) -> Goal {
    let goal = if subs == 1 {
        "4K RGBA zero-copy msgs/s, 1 subscriber".to_owned()
    } else {
        format!("4K RGBA zero-copy msgs/s to each of {subs} subscribers")
    };
    let target = format!("≥ {}", fmt_num(min));
    match d.tput(ZERO_COPY, FRAME_4K_RGBA, subs) {
        Some(c) => Goal::new(&goal, &target, format!("{} msgs/s", fmt_num(c.msgs)), Status::of(&[c.msgs >= min])),
        None => Goal::not_measured(&goal, &target, &format!("no 4K RGBA `zero-copy` row with {subs} subscriber(s)")),
    }
}

fn goal_first(d: &Data) -> Goal {
    // The goal is the subscriber's own cost, handshake + first import: link up after
    // the declaration, plus the trip of the first frame published once it is (`setup`).
    // Declaration → first frame ready also waits for the publisher's next frame, which
    // depends on its rate; it is shown beside, with that rate.
    let goal = "First message to a new subscriber (link up + first frame's trip), p50";
    let target = format!("≤ {}", fmt_us(GOAL_FIRST_US));
    let rec = d.first.iter().find(|r| r.str("path") == Some(ZERO_COPY)).or(d.first.first());
    let Some((rec, p50)) = rec.and_then(|r| Some((r, r.num("setup_p50_us")?))) else {
        return Goal::not_measured(goal, &target, "no `first-message` row with `setup_p50_us`");
    };
    let mut measured = fmt_us(p50);
    let mut extra = Vec::new();
    if let Some(m) = rec.num("setup_max_us") {
        extra.push(format!("max {}", fmt_us(m)));
    }
    if let Some(n) = rec.uint("subscribers") {
        extra.push(format!("{n} subscribers"));
    }
    if let Some(linked) = rec.num("linked_p50_us") {
        extra.push(format!("link up {}", fmt_us(linked)));
    }
    if let Some(trip) = rec.num("first_zero_copy_net_p50_us") {
        extra.push(format!("first frame's trip {}", fmt_us(trip)));
    }
    if let (Some(any), Some(rate)) = (rec.num("first_ready_p50_us"), rec.num("rate_hz")) {
        extra.push(format!(
            "declaration → first frame ready {} with a frame every {}",
            fmt_us(any),
            fmt_us(1e6 / rate)
        ));
    }
    if !extra.is_empty() {
        let _ = write!(measured, " ({})", extra.join(", "));
    }
    Goal::new(goal, &target, measured, Status::of(&[p50 <= GOAL_FIRST_US]))
}

/// Anchor RTT p50 ÷ zero-copy RTT p50 at each size both measured; every ratio must
/// satisfy `ok`.
fn goal_vs(d: &Data, anchor: &str, goal: &str, target: &str, ok: impl Fn(f64) -> bool) -> Goal {
    let (Some(zc), Some(a)) = (d.lat(ZERO_COPY, false), d.lat(anchor, true)) else {
        return Goal::not_measured(goal, target, &format!("needs `zero-copy` and `{anchor}` rows"));
    };
    let (mut parts, mut checks) = (Vec::new(), Vec::new());
    for (size, ac) in &a.cells {
        if let Some(zcc) = zc.cells.get(size) {
            let ratio = ac.rtt_p50 / zcc.rtt_p50;
            checks.push(ok(ratio));
            parts.push(format!(
                "{} {} ({} vs {} µs)",
                human_size(*size),
                fmt_ratio(ratio),
                fmt_num(ac.rtt_p50),
                fmt_num(zcc.rtt_p50)
            ));
        }
    }
    if checks.is_empty() {
        return Goal::not_measured(goal, target, &format!("`zero-copy` and `{anchor}` share no size"));
    }
    Goal::new(goal, target, parts.join(", "), Status::of(&checks))
}

fn goals(d: &Data) -> Vec<Goal> {
    let torch = format!("≥ {GOAL_TORCH_RATIO}× (their RTT ÷ ours)");
    vec![
        goal_flat(d, Stat::P50, "Zero-copy ÷ 64 B `zenoh-plain`, p50, one way = RTT/2", GOAL_FLAT_P50),
        goal_flat(d, Stat::P99, "Zero-copy ÷ 64 B `zenoh-plain`, p99, one way = RTT/2", GOAL_FLAT_P99),
        goal_flat(d, Stat::MeasuredP50, "Zero-copy ÷ 64 B `zenoh-plain`, p50, measured one way", GOAL_FLAT_P50),
        goal_flat(d, Stat::MeasuredP99, "Zero-copy ÷ 64 B `zenoh-plain`, p99, measured one way", GOAL_FLAT_P99),
        goal_copy(d),
        goal_provider(d),
        goal_4k(d, 1, GOAL_4K_ONE),
        goal_4k(d, 4, GOAL_4K_FOUR),
        goal_peer_latency(d),
        goal_peer_read(d),
        goal_4k_peer(d),
        goal_host_block(d),
        goal_cross_host(d),
        goal_first(d),
        goal_vs(d, "torch-mp-ipc-hold", "Round trip vs torch.multiprocessing, tensors kept (hold)", &torch, |r| {
            r >= GOAL_TORCH_RATIO
        }),
        goal_vs(d, "torch-mp-ipc-drop", "Round trip vs torch.multiprocessing, tensors dropped (drop)", &torch, |r| {
            r >= GOAL_TORCH_RATIO
        }),
        goal_vs(d, "cuda-core-ipc-hold", "Round trip vs the cuda.core IPC pool (hold)", "lower (ratio > 1×)", |r| {
            r > 1.0
        }),
        goal_vs(d, "cuda-core-ipc-drop", "Round trip vs the cuda.core IPC pool (drop)", "lower (ratio > 1×)", |r| {
            r > 1.0
        }),
    ]
}

// ---------------------------------------------------------------------------------
// Formatting
// ---------------------------------------------------------------------------------

/// `12345` → `12,345`.
fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Three significant figures or so: `7.14`, `51.2`, `370`, `15,800`.
fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "—".into();
    }
    let a = v.abs();
    let sign = if v < 0.0 { "-" } else { "" };
    if a >= 100.0 {
        format!("{sign}{}", group(a.round() as u64))
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn fmt_ratio(r: f64) -> String {
    if r >= 100.0 {
        format!("{}×", group(r.round() as u64))
    } else if r >= 10.0 {
        format!("{r:.1}×")
    } else {
        format!("{r:.2}×")
    }
}

/// Microseconds, in ms or s when large.
fn fmt_us(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", fmt_num(us / 1e6))
    } else if us >= 1e3 {
        format!("{} ms", fmt_num(us / 1e3))
    } else {
        format!("{} µs", fmt_num(us))
    }
}

/// `4096` → `4 KiB`; sizes that are not a whole number of units get two decimals.
fn human_size(b: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if b >= unit {
            return if b.is_multiple_of(unit) {
                format!("{} {name}", b / unit)
            } else {
                format!("{:.2} {name}", b as f64 / unit as f64)
            };
        }
    }
    format!("{b} B")
}

fn frame_label(size: u64) -> String {
    match size {
        FRAME_1080P_RGB => "1080p RGB".into(),
        FRAME_4K_RGBA => "4K RGBA".into(),
        s => human_size(s),
    }
}

fn size_header(size: u64) -> String {
    if size == 0 { "no payload".into() } else { human_size(size) }
}

fn pair(p50: f64, p99: Option<f64>) -> String {
    match p99 {
        Some(p99) => format!("{} / {}", fmt_num(p50), fmt_num(p99)),
        None => fmt_num(p50),
    }
}

fn n_range(ns: impl Iterator<Item = Option<u64>>) -> String {
    let ns: Vec<u64> = ns.flatten().collect();
    match (ns.iter().min(), ns.iter().max()) {
        (Some(a), Some(b)) if a == b => group(*a),
        (Some(a), Some(b)) => format!("{}–{}", group(*a), group(*b)),
        _ => "—".into(),
    }
}

fn md_table(out: &mut String, header: &[String], rows: &[Vec<String>]) {
    let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
    out.push_str(&line(header));
    out.push_str(&format!("|{}\n", "---|".repeat(header.len())));
    for r in rows {
        out.push_str(&line(r));
    }
    out.push('\n');
}

// ---------------------------------------------------------------------------------
// report.md
// ---------------------------------------------------------------------------------

const DASH_LEGEND: &str = "— : not measured.";

fn setup_summary(d: &Data, bench: &str) -> Option<String> {
    let s = d.setups.iter().find(|s| s.bench() == bench && !s.fields.contains_key("script"))?;
    let keys = [
        "backend",
        "gpu",
        "iters",
        "warmup",
        "frames",
        "max_secs_per_row",
        "transport",
        "shm",
        "host_registered",
        "subscriber_work",
    ];
    let parts: Vec<String> = keys
        .iter()
        .filter_map(|k| {
            let v = s.fields.get(*k)?;
            Some(format!("{k} {}", v.as_str().map_or_else(|| v.to_string(), str::to_owned)))
        })
        .collect();
    Some(format!("Setup ({}): {}.\n\n", s.file, parts.join("; ")))
}

/// The rows of `bench` a benchmark skipped, one line each, or nothing.
fn skipped_lines(d: &Data, bench: &str) -> String {
    let lines: Vec<String> = d
        .skipped
        .iter()
        .filter(|r| r.bench() == bench)
        .map(|r| {
            let size = r.uint("size").map_or("?".into(), human_size);
            let subs = r.uint("subscribers").map_or(String::new(), |n| format!(", {n} sub(s)"));
            format!("- `{}` {size}{subs}: {}\n", r.str("path").unwrap_or("?"), r.str("skipped").unwrap_or(""))
        })
        .collect();
    if lines.is_empty() { String::new() } else { format!("Skipped by the benchmark:\n\n{}\n", lines.concat()) }
}

fn latency_section(out: &mut String, d: &Data) {
    out.push_str("## Publish → subscriber-ready latency (`zcs_latency`, `zcs_zenoh_shm`)\n\n");
    let rows: Vec<&LatRow> = d.latency.iter().filter(|r| !r.anchor).collect();
    if rows.is_empty() {
        out.push_str("Not measured in this run (no `latency` rows from `zcs_latency` or `zcs_zenoh_shm`).\n\n");
        out.push_str(&skipped_lines(d, "latency"));
        return;
    }
    for bench in ["latency-setup", "zenoh-shm-setup"] {
        if let Some(s) = setup_summary(d, bench) {
            out.push_str(&s);
        }
    }
    let sizes: BTreeSet<u64> = rows.iter().flat_map(|r| r.cells.keys().copied()).collect();
    let mut header = vec!["Path, figure (µs, p50 / p99)".to_owned()];
    header.extend(sizes.iter().map(|&s| size_header(s)));
    header.push("n".into());
    let mut table = Vec::new();
    for r in &rows {
        let mut line = |label: &str, get: &CellFigures| {
            let mut row = vec![format!("`{}` ({}), {label}", r.path, r.backend)];
            row.extend(sizes.iter().map(|s| r.cells.get(s).and_then(get).map_or("—".into(), |(a, b)| pair(a, b))));
            row.push(n_range(r.cells.values().map(|c| c.n)));
            table.push(row);
        };
        line("one way = RTT/2", &|c| Some((c.p50, c.p99)));
        if r.cells.values().any(|c| c.measured_p50.is_some()) {
            line("measured one way", &|c| c.measured_p50.map(|m| (m, c.measured_p99)));
        }
    }
    md_table(out, &header, &table);
    let measured = rows.iter().any(|r| r.cells.values().any(|c| c.measured_p50.is_some()));
    let _ = writeln!(
        out,
        "{DASH_LEGEND} RTT/2: half the ping-pong round trip. Measured one way: the receiver's own clock from \
         publication to ready{}.\n",
        if measured { "" } else { " (not measured in this run: its rows carry no `measured_one_way_*` fields)" }
    );
    out.push_str(&skipped_lines(d, "latency"));
}

fn anchors_section(out: &mut String, d: &Data) {
    out.push_str("## Python anchors (`bench/python/`, one way = RTT/2)\n\n");
    let rows: Vec<&LatRow> = d.latency.iter().filter(|r| r.anchor).collect();
    if rows.is_empty() {
        out.push_str("Not measured in this run (no latency rows from the Python scripts).\n\n");
        return;
    }
    let sizes: BTreeSet<u64> = rows.iter().flat_map(|r| r.cells.keys().copied()).collect();
    let mut header = vec!["Path (µs, p50 / p99)".to_owned()];
    header.extend(sizes.iter().map(|&s| size_header(s)));
    header.push("n".into());
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut row = vec![format!("`{}`", r.path)];
            row.extend(sizes.iter().map(|s| r.cells.get(s).map_or("—".into(), |c| pair(c.p50, c.p99))));
            row.push(n_range(r.cells.values().map(|c| c.n)));
            row
        })
        .collect();
    md_table(out, &header, &table);
    let _ = writeln!(out, "{DASH_LEGEND} \"no payload\": the transport's floor (a tiny tuple).\n");
}

/// `zcs_peer_bench`: reads and copies across the link between two GPUs.
fn peer_section(out: &mut String, d: &Data) {
    if d.peer.is_empty() {
        return;
    }
    out.push_str("## Reading across peer GPUs (`zcs_peer_bench`)\n\n");
    let sizes: BTreeSet<u64> = d.peer.iter().flat_map(|r| r.cells.keys().copied()).collect();
    let mut header = vec!["Path, µs p50 / p99 (GB/s at p50)".to_owned()];
    header.extend(sizes.iter().map(|&s| size_header(s)));
    let table: Vec<Vec<String>> = d
        .peer
        .iter()
        .map(|r| {
            let mut row = vec![format!("`{}`", r.path)];
            row.extend(sizes.iter().map(|&s| {
                r.cells.get(&s).map_or("—".into(), |&(p50, p99)| {
                    format!("{} ({})", pair(p50, p99), fmt_num(s as f64 / p50 / 1e3))
                })
            }));
            row
        })
        .collect();
    md_table(out, &header, &table);
    let _ = writeln!(out, "{DASH_LEGEND}\n");
}

fn d2d_section(out: &mut String, d: &Data) {
    out.push_str("## Device-to-device copy (the physical reference)\n\n");
    if d.d2d.is_empty() {
        out.push_str("Not measured in this run (no `d2d-copy` rows).\n\n");
        return;
    }
    let sizes: BTreeSet<u64> = d.d2d.iter().flat_map(|r| r.cells.keys().copied()).collect();
    let mut header = vec!["Copy (µs, p50 / p99; GB/s at p50)".to_owned()];
    header.extend(sizes.iter().map(|&s| human_size(s)));
    let table: Vec<Vec<String>> = d
        .d2d
        .iter()
        .map(|r| {
            let mut row = vec![r.label.clone()];
            row.extend(sizes.iter().map(|s| {
                r.cells.get(s).map_or("—".into(), |&(p50, p99, gbps)| match gbps {
                    Some(g) => format!("{} ({} GB/s)", pair(p50, p99), fmt_num(g)),
                    None => pair(p50, p99),
                })
            }));
            row
        })
        .collect();
    md_table(out, &header, &table);
    let _ = writeln!(out, "{DASH_LEGEND}\n");
}

fn throughput_section(out: &mut String, d: &Data) {
    out.push_str("## Throughput (`zcs_throughput`, `zcs_zenoh_shm`)\n\n");
    if d.throughput.is_empty() {
        out.push_str("Not measured in this run (no `throughput` rows).\n\n");
        out.push_str(&skipped_lines(d, "throughput"));
        return;
    }
    for bench in ["throughput-setup", "zenoh-shm-setup"] {
        if let Some(s) = setup_summary(d, bench) {
            out.push_str(&s);
        }
    }
    let cols: BTreeSet<(u64, u64)> = d.throughput.iter().flat_map(|r| r.cells.keys().copied()).collect();
    let col_name =
        |&(size, subs): &(u64, u64)| format!("{}, {subs} sub{}", frame_label(size), if subs == 1 { "" } else { "s" });
    let table = |f: &dyn Fn(&TputCell) -> String| -> Vec<Vec<String>> {
        d.throughput
            .iter()
            .map(|r| {
                let mut row = vec![format!("`{}`", r.path)];
                row.extend(cols.iter().map(|k| r.cells.get(k).map_or("—".into(), f)));
                row
            })
            .collect()
    };
    let mut header = vec!["Path: msgs/s per subscriber (GB/s)".to_owned()];
    header.extend(cols.iter().map(col_name));
    md_table(
        out,
        &header,
        &table(&|c| match c.gbps {
            Some(g) => format!("{} ({})", fmt_num(c.msgs), fmt_num(g)),
            None => fmt_num(c.msgs),
        }),
    );
    header[0] = "Path: CPU µs per message, publisher / one subscriber".into();
    md_table(
        out,
        &header,
        &table(&|c| {
            let f = |v: Option<f64>| v.map_or("—".into(), fmt_num);
            if c.pub_cpu.is_none() && c.sub_cpu.is_none() {
                "—".into()
            } else {
                format!("{} / {}", f(c.pub_cpu), f(c.sub_cpu))
            }
        }),
    );
    let mut bad = Vec::new();
    let mut unknown = 0;
    for r in &d.throughput {
        for (k, c) in &r.cells {
            match (c.errors, c.lost) {
                (Some(0), Some(0)) => {}
                (Some(e), Some(l)) => bad.push(format!("`{}` {}: {e} errors, {l} lost", r.path, col_name(k))),
                _ => unknown += 1,
            }
        }
    }
    let mut notes = vec![DASH_LEGEND.to_owned()];
    if bad.is_empty() && unknown == 0 {
        notes.push("Every row: 0 errors, 0 lost frames.".into());
    }
    if !bad.is_empty() {
        notes.push(format!("Rows with errors or lost frames: {}.", bad.join("; ")));
    }
    if unknown > 0 {
        notes.push(format!("{unknown} row(s) do not report errors and lost frames."));
    }
    let _ = writeln!(out, "{}\n", notes.join(" "));
    out.push_str(&skipped_lines(d, "throughput"));
}

fn first_section(out: &mut String, d: &Data) {
    out.push_str("## First message to a new subscriber\n\n");
    if d.first.is_empty() {
        out.push_str("Not measured in this run (no `first-message` rows).\n\n");
        return;
    }
    let header: Vec<String> = [
        "Path",
        "Frame",
        "Publish rate",
        "Subscribers",
        "First ready p50 / max",
        "without the frame wait",
        "First zero-copy p50 / max",
        "without the frame wait",
        "Link up + first trip p50 / max",
        "Reached zero-copy",
    ]
    .map(String::from)
    .to_vec();
    let us = |r: &Record, p50: &str, max: &str| match r.num(p50) {
        Some(a) => format!("{} / {}", fmt_us(a), r.num(max).map_or("—".into(), fmt_us)),
        None => "—".into(),
    };
    let table: Vec<Vec<String>> = d
        .first
        .iter()
        .map(|r| {
            vec![
                format!("`{}`", r.str("path").unwrap_or("?")),
                r.uint("size").map_or("—".into(), human_size),
                r.num("rate_hz").map_or("—".into(), |v| format!("{} Hz", fmt_num(v))),
                r.uint("subscribers").map_or("—".into(), group),
                us(r, "first_ready_p50_us", "first_ready_max_us"),
                us(r, "first_ready_net_p50_us", "first_ready_net_max_us"),
                us(r, "first_zero_copy_p50_us", "first_zero_copy_max_us"),
                us(r, "first_zero_copy_net_p50_us", "first_zero_copy_net_max_us"),
                us(r, "setup_p50_us", "setup_max_us"),
                r.uint("zero_copy_reached").map_or("—".into(), group),
            ]
        })
        .collect();
    md_table(out, &header, &table);
}

fn pool_section(out: &mut String, d: &Data) {
    out.push_str("## Pool micro-benchmarks (`zcs_pool_bench`)\n\n");
    if d.pool.is_empty() {
        out.push_str("Not measured in this run (no pool rows).\n\n");
        return;
    }
    let sizes: BTreeSet<u64> = d.pool.iter().flat_map(|r| r.cells.keys().copied()).collect();
    let mut header = vec!["Measurement (µs, p50 / p99)".to_owned()];
    header.extend(sizes.iter().map(|&s| human_size(s)));
    header.push("n".into());
    let table: Vec<Vec<String>> =
        d.pool
            .iter()
            .map(|r| {
                let mut row = vec![format!("`{}` ({})", r.bench, r.backend)];
                row.extend(sizes.iter().map(|s| {
                    r.cells.get(s).map_or("—".into(), |&(p50, p99, _)| pair(p50 / 1e3, p99.map(|v| v / 1e3)))
                }));
                row.push(n_range(r.cells.values().map(|c| c.2).map(|n| n.or(Some(1)))));
                row
            })
            .collect();
    md_table(out, &header, &table);
    let _ = writeln!(out, "{DASH_LEGEND} A single figure: one measurement.\n");
}

fn machine_lines(out: &mut String, run: &Run, d: &Data) {
    match &run.machine {
        Some(m) if !m.fields.is_empty() => {
            let parts: Vec<String> = m.fields.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            let _ = writeln!(out, "Machine (`machine.txt`): {}.\n", parts.join("; "));
        }
        Some(_) => out.push_str("Machine: `machine.txt` holds no nvidia-smi CSV line.\n\n"),
        None => out.push_str("Machine: not recorded (no `machine.txt` in the run folder).\n\n"),
    }
    let mut gpus: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for s in &d.setups {
        if let Some(g) = s.str("gpu") {
            gpus.entry(g).or_default().push(s.file.as_str());
        }
    }
    if !gpus.is_empty() {
        let parts: Vec<String> = gpus.iter().map(|(g, files)| format!("{g} ({})", files.join(", "))).collect();
        let _ = writeln!(out, "GPU named by the benchmarks: {}.\n", parts.join("; "));
    }
}

fn report_md(run: &Run, d: &Data, goals: &[Goal]) -> String {
    let mut out = String::from("# Benchmark report\n\n");
    let files: Vec<String> =
        run.files.iter().map(|(f, n)| format!("`{f}` ({n} row{})", if *n == 1 { "" } else { "s" })).collect();
    let _ = writeln!(out, "Files: {}.\n", if files.is_empty() { "none".into() } else { files.join(", ") });
    machine_lines(&mut out, run, d);
    out.push_str("## Goals\n\nComputed from this run's rows.\n\n");
    let header = ["Goal", "Target", "Measured", "Status"].map(String::from).to_vec();
    let rows: Vec<Vec<String>> = goals
        .iter()
        .map(|g| vec![g.goal.clone(), g.target.clone(), g.measured.clone(), g.status.text().into()])
        .collect();
    md_table(&mut out, &header, &rows);
    out.push_str("Plots: `latency.png` (one way p50 against size, log-log), `throughput.png` (msgs/s per path).\n\n");
    latency_section(&mut out, d);
    anchors_section(&mut out, d);
    peer_section(&mut out, d);
    d2d_section(&mut out, d);
    throughput_section(&mut out, d);
    first_section(&mut out, d);
    pool_section(&mut out, d);
    if !d.errors.is_empty() || !run.warnings.is_empty() {
        out.push_str("## Notes\n\n");
        for e in &d.errors {
            let _ = writeln!(out, "- error row in `{}`: `{}`", e.file, Value::Object(e.fields.clone()));
        }
        for w in &run.warnings {
            let _ = writeln!(out, "- {w}");
        }
        out.push('\n');
    }
    out
}

fn run_json(run: &Run, goals: &[Goal]) -> Value {
    let records: Vec<Value> = run
        .records
        .iter()
        .map(|r| {
            let mut o = r.fields.clone();
            o.entry("source_file").or_insert_with(|| json!(r.file));
            Value::Object(o)
        })
        .collect();
    let machine = run.machine.as_ref().map(|m| {
        let fields: Map<String, Value> = m.fields.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        json!({"fields": fields, "text": m.text})
    });
    let goals: Vec<Value> = goals
        .iter()
        .map(|g| json!({"goal": g.goal, "target": g.target, "measured": g.measured, "status": g.status.word()}))
        .collect();
    json!({"records": records, "machine": machine, "goals": goals, "warnings": run.warnings})
}

// ---------------------------------------------------------------------------------
// Plots
// ---------------------------------------------------------------------------------

const PALETTE: [RGBColor; 12] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
    RGBColor(60, 60, 60),
    RGBColor(255, 187, 120),
    RGBColor(152, 223, 138),
];

type PlotResult = Result<(), Box<dyn Error>>;

/// A linear `f64` axis whose ticks and grid lines sit exactly at `keys` (the plots
/// pass log2 or log10 values, so ticks fall on measured sizes and on 1-2-5 decades).
struct KeyedAxis {
    lo: f64,
    hi: f64,
    keys: Vec<f64>,
}

impl Ranged for KeyedAxis {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let frac = (v - self.lo) / (self.hi - self.lo);
        limit.0 + (f64::from(limit.1 - limit.0) * frac).round() as i32
    }

    fn key_points<H: plotters::coord::ranged1d::KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        self.keys.clone()
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// Picks a (p50, p99) pair out of a latency cell.
type CellFigures = dyn Fn(&LatCell) -> Option<(f64, Option<f64>)>;

/// A line of the latency plot: (size in bytes, µs) points.
#[derive(Debug, Clone)]
struct Series {
    label: String,
    points: Vec<(f64, f64)>,
    dashed: bool,
}

/// Every latency path with a payload, ours (RTT/2 solid, measured one way dashed),
/// the anchors, then the D2D copies.
fn latency_series(d: &Data) -> Vec<Series> {
    let mut out = Vec::new();
    let mut push = |label: String, points: Vec<(f64, f64)>, dashed: bool| {
        if !points.is_empty() {
            out.push(Series { label, points, dashed });
        }
    };
    let ours = d.latency.iter().filter(|r| !r.anchor && r.path != PLAIN);
    for r in ours.chain(d.latency.iter().filter(|r| r.anchor)) {
        let sized = || r.cells.iter().filter(|(s, _)| **s > 0);
        let who = if r.anchor || !is_ours(&r.path) { "" } else { "ours, " };
        let rtt: Vec<(f64, f64)> = sized().map(|(&s, c)| (s as f64, c.p50)).collect();
        push(format!("{who}{} (RTT/2)", r.path), rtt, false);
        if !r.anchor {
            let m: Vec<(f64, f64)> = sized().filter_map(|(&s, c)| Some((s as f64, c.measured_p50?))).collect();
            push(format!("{who}{} (measured)", r.path), m, true);
        }
    }
    for r in &d.d2d {
        let pts = r.cells.iter().map(|(&s, c)| (s as f64, c.0)).collect();
        push(r.short.clone(), pts, true);
    }
    out
}

/// Key points of a log10 axis between `lo` and `hi` (log10 values): 1, 2 and 5 of
/// each decade.
fn log10_keys(lo: f64, hi: f64) -> Vec<f64> {
    let mut keys = Vec::new();
    for e in (lo.floor() as i32)..=(hi.ceil() as i32) {
        for m in [1.0f64, 2.0, 5.0] {
            let k = (m * 10f64.powi(e)).log10();
            if k >= lo && k <= hi {
                keys.push(k);
            }
        }
    }
    keys
}

fn fmt_axis_us(us: f64) -> String {
    if us >= 1e3 { format!("{} ms", fmt_axis_num(us / 1e3)) } else { format!("{} µs", fmt_axis_num(us)) }
}

fn fmt_axis_num(v: f64) -> String {
    if v >= 1.0 { group(v.round() as u64) } else { format!("{v}") }
}

fn register_font(path: &Path) -> Result<(), String> {
    let bytes = std::fs::read(path).map_err(|e| {
        format!(
            "cannot read the plot font {}: {e}; pass --font with a TrueType font (Debian: fonts-dejavu-core)",
            path.display()
        )
    })?;
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| format!("{} is not a TrueType/OpenType font (--font)", path.display()))
}

fn write_png(path: &Path, (w, h): (u32, u32), rgb: &[u8]) -> PlotResult {
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut enc = png::Encoder::new(file, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header()?;
    writer.write_image_data(rgb)?;
    writer.finish()?;
    Ok(())
}

/// Draws into an RGB buffer of `size`, then writes it as a PNG.
fn render(
    path: &Path,
    size: (u32, u32),
    draw: impl FnOnce(DrawingArea<BitMapBackend, plotters::coord::Shift>) -> PlotResult,
) -> PlotResult {
    let mut buf = vec![255u8; size.0 as usize * size.1 as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, size).into_drawing_area();
        root.fill(&WHITE)?;
        draw(root.clone())?;
        root.present()?;
    }
    write_png(path, size, &buf)
}

fn not_measured_text(area: &DrawingArea<BitMapBackend, plotters::coord::Shift>, text: &str) -> PlotResult {
    let (w, h) = area.dim_in_pixel();
    let style = ("sans-serif", 28).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Center));
    area.draw(&Text::new(text.to_owned(), (w as i32 / 2, h as i32 / 2), style))?;
    Ok(())
}

fn plot_latency(d: &Data, path: &Path) -> PlotResult {
    let series = latency_series(d);
    let plain = d.lat(PLAIN, false).and_then(|r| r.cells.get(&PLAIN_SIZE)).map(|c| c.p50);
    render(path, (1500, 850), |root| {
        if series.is_empty() {
            return not_measured_text(&root, "Latency not measured in this run");
        }
        let (chart_area, legend_area) = root.split_horizontally(1060);
        let xs: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
        let mut ys: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).collect();
        let refs: Vec<(String, f64, bool)> = plain
            .map(|p| {
                vec![
                    (format!("zenoh-plain 64 B p50 (RTT/2): {}", fmt_us(p)), p, false),
                    (format!("goal: {GOAL_FLAT_P50} × the 64 B p50"), p * GOAL_FLAT_P50, true),
                ]
            })
            .unwrap_or_default();
        ys.extend(refs.iter().map(|r| r.1));
        let (xmin, xmax) = xs.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        let (ymin, ymax) = ys.iter().fold((f64::MAX, f64::MIN), |(a, b), &y| (a.min(y), b.max(y)));
        let (x0, x1) = (xmin.log2() - 0.6, xmax.log2() + 0.6);
        let (y0, y1) = (ymin.log10() - 0.15, ymax.log10() + 0.15);
        let xkeys: Vec<f64> =
            xs.iter().map(|x| x.log2()).collect::<Vec<_>>().into_iter().fold(Vec::new(), |mut v, k| {
                if !v.iter().any(|o: &f64| (o - k).abs() < 1e-9) {
                    v.push(k);
                }
                v
            });
        let mut chart = ChartBuilder::on(&chart_area)
            .caption("Publish → ready latency, one way p50 (log-log)", ("sans-serif", 26))
            .margin(16)
            .x_label_area_size(55)
            .y_label_area_size(90)
            .build_cartesian_2d(
                KeyedAxis { lo: x0, hi: x1, keys: xkeys },
                KeyedAxis { lo: y0, hi: y1, keys: log10_keys(y0, y1) },
            )?;
        chart
            .configure_mesh()
            .x_desc("payload size (log scale; ticks at the measured sizes)")
            .y_desc("one way p50 (log scale)")
            .x_label_formatter(&|v| human_size(2f64.powf(*v).round() as u64))
            .y_label_formatter(&|v| fmt_axis_us(10f64.powf(*v)))
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 17))
            .bold_line_style(BLACK.mix(0.12))
            .draw()?;
        let mut legend: Vec<(String, RGBColor, bool, bool)> = Vec::new();
        for (i, (label, v, dashed)) in refs.iter().enumerate() {
            let color = if i == 0 { RGBColor(90, 90, 90) } else { RGBColor(150, 150, 150) };
            let pts = vec![(x0, v.log10()), (x1, v.log10())];
            if *dashed {
                chart.draw_series(DashedLineSeries::new(pts, 10, 6, color.stroke_width(2)))?;
            } else {
                chart.draw_series(LineSeries::new(pts, color.stroke_width(2)))?;
            }
            legend.push((label.clone(), color, *dashed, false));
        }
        for (i, s) in series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (x.log2(), y.log10())).collect();
            if s.dashed {
                chart.draw_series(DashedLineSeries::new(pts.clone(), 8, 5, color.stroke_width(2)))?;
            } else {
                chart.draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))?;
            }
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
            legend.push((s.label.clone(), color, s.dashed, true));
        }
        let font = ("sans-serif", 15).into_font().color(&BLACK);
        for (i, (label, color, dashed, marker)) in legend.iter().enumerate() {
            let y = 70 + i as i32 * 26;
            let style = color.stroke_width(if *dashed { 2 } else { 3 });
            if *dashed {
                for k in 0..3 {
                    legend_area.draw(&PathElement::new(vec![(8 + k * 15, y), (17 + k * 15, y)], style))?;
                }
            } else {
                legend_area.draw(&PathElement::new(vec![(8, y), (50, y)], style))?;
            }
            if *marker {
                legend_area.draw(&Circle::new((29, y), 4, color.filled()))?;
            }
            legend_area.draw(&Text::new(label.clone(), (60, y - 8), font.clone()))?;
        }
        Ok(())
    })
}

fn plot_throughput(d: &Data, path: &Path) -> PlotResult {
    let sizes: BTreeSet<u64> = d.throughput.iter().flat_map(|r| r.cells.keys().map(|k| k.0)).collect();
    let height = 460 * sizes.len().max(1) as u32;
    render(path, (1500, height), |root| {
        if sizes.is_empty() {
            return not_measured_text(&root, "Throughput not measured in this run");
        }
        let panels = root.split_evenly((sizes.len(), 1));
        for (panel, &size) in panels.iter().zip(&sizes) {
            let rows: Vec<&TputRow> = d.throughput.iter().filter(|r| r.cells.keys().any(|k| k.0 == size)).collect();
            let subs: BTreeSet<u64> =
                rows.iter().flat_map(|r| r.cells.keys().filter(|k| k.0 == size).map(|k| k.1)).collect();
            let subs: Vec<u64> = subs.into_iter().collect();
            // The throughput goals, drawn on the 4K RGBA panel: (subscribers, msgs/s).
            let goal_lines: Vec<(u64, f64)> = if size == FRAME_4K_RGBA {
                [(1, GOAL_4K_ONE), (4, GOAL_4K_FOUR)].into_iter().filter(|(s, _)| subs.contains(s)).collect()
            } else {
                Vec::new()
            };
            let ymax = rows
                .iter()
                .flat_map(|r| r.cells.iter().filter(|(k, _)| k.0 == size).map(|(_, c)| c.msgs))
                .chain(goal_lines.iter().map(|g| g.1))
                .fold(0.0, f64::max);
            let names: Vec<String> = rows.iter().map(|r| r.path.clone()).collect();
            let n = rows.len() as f64;
            let xkeys: Vec<f64> = (0..rows.len()).map(|i| i as f64 + 0.5).collect();
            let mut chart = ChartBuilder::on(panel)
                .caption(
                    format!("{} frames ({}): msgs/s per subscriber", frame_label(size), group(size) + " B"),
                    ("sans-serif", 22),
                )
                .margin(14)
                .x_label_area_size(40)
                .y_label_area_size(90)
                .build_cartesian_2d(KeyedAxis { lo: 0.0, hi: n, keys: xkeys }, 0.0..(ymax * 1.18).max(1.0))?;
            chart
                .configure_mesh()
                .x_label_formatter(&|v| names.get(v.floor() as usize).cloned().unwrap_or_default())
                .y_label_formatter(&|v| group(v.round() as u64))
                .y_desc("msgs/s")
                .label_style(("sans-serif", 16))
                .axis_desc_style(("sans-serif", 17))
                .disable_x_mesh()
                .bold_line_style(BLACK.mix(0.12))
                .light_line_style(TRANSPARENT)
                .draw()?;
            let width = 0.8 / subs.len() as f64;
            for (j, &s) in subs.iter().enumerate() {
                let color = PALETTE[j % PALETTE.len()];
                let bars: Vec<(f64, f64)> = rows
                    .iter()
                    .enumerate()
                    .filter_map(|(i, r)| Some((i as f64 + 0.1 + j as f64 * width, r.cells.get(&(size, s))?.msgs)))
                    .collect();
                chart
                    .draw_series(
                        bars.iter().map(|&(x, v)| Rectangle::new([(x, 0.0), (x + width * 0.92, v)], color.filled())),
                    )?
                    .label(format!("{s} subscriber{}", if s == 1 { "" } else { "s" }))
                    .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], color.filled()));
                let font = ("sans-serif", 14).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom));
                chart.draw_series(
                    bars.iter().map(|&(x, v)| Text::new(fmt_num(v), (x + width * 0.46, v + ymax * 0.01), font.clone())),
                )?;
            }
            for &(s, goal) in &goal_lines {
                let color = PALETTE[subs.iter().position(|&x| x == s).unwrap_or(0) % PALETTE.len()];
                chart
                    .draw_series(DashedLineSeries::new(vec![(0.0, goal), (n, goal)], 10, 6, color.stroke_width(2)))?
                    .label(format!("goal, {s} subscriber{}: {}", if s == 1 { "" } else { "s" }, group(goal as u64)))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .label_font(("sans-serif", 16))
                .background_style(WHITE.mix(0.9))
                .border_style(BLACK.mix(0.4))
                .draw()?;
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------

fn run(args: &Args) -> Result<PathBuf, Box<dyn Error>> {
    register_font(&args.font)?;
    let run = load_run(&args.run)?;
    if run.files.is_empty() {
        return Err(format!("no *.jsonl file in {}", args.run.display()).into());
    }
    let mut warnings = run.warnings.clone();
    let data = aggregate(&run.records, &mut warnings);
    let run = Run { warnings, ..run };
    for w in &run.warnings {
        eprintln!("warning: {w}");
    }
    let goals = goals(&data);
    let out = args.out.clone().unwrap_or_else(|| args.run.join("report"));
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    std::fs::write(out.join("report.md"), report_md(&run, &data, &goals))?;
    std::fs::write(out.join("run.json"), serde_json::to_string_pretty(&run_json(&run, &goals))? + "\n")?;
    plot_latency(&data, &out.join("latency.png"))?;
    plot_throughput(&data, &out.join("throughput.png"))?;
    Ok(out)
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(out) => {
            println!("zcs_report: wrote report.md, latency.png, throughput.png and run.json to {}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("zcs_report: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `(file, text)` pairs and aggregates them, as the binary does.
    fn data_of(files: &[(&str, &str)]) -> (Vec<Record>, Data, Vec<String>) {
        let mut warnings = Vec::new();
        let records: Vec<Record> = files.iter().flat_map(|(f, t)| parse_jsonl(f, t, &mut warnings)).collect();
        let data = aggregate(&records, &mut warnings);
        (records, data, warnings)
    }

    fn goal<'a>(goals: &'a [Goal], prefix: &str) -> &'a Goal {
        goals.iter().find(|g| g.goal.starts_with(prefix)).unwrap_or_else(|| panic!("no goal {prefix}"))
    }

    const LATENCY: &str = r#"{"bench":"latency-setup","backend":"cuda-vmm","iters":100}
{"bench":"latency","path":"zero-copy","backend":"cuda-vmm","size":4096,"n":100,"one_way_p50_us":44.0,"one_way_p99_us":70.0,"rtt_p50_us":88.0,"measured_one_way_p50_us":30.0,"measured_one_way_p99_us":50.0}
{"bench":"latency","path":"zero-copy","backend":"cuda-vmm","size":33554432,"n":100,"one_way_p50_us":50.0,"one_way_p99_us":90.0,"rtt_p50_us":100.0,"measured_one_way_p50_us":31.0,"measured_one_way_p99_us":45.0}
{"bench":"latency","path":"cpu-bytes","backend":"cuda-vmm","size":33554432,"n":50,"one_way_p50_us":2600.0,"one_way_p99_us":3000.0,"rtt_p50_us":5200.0}
{"bench":"latency","path":"zenoh-plain","backend":"none","size":64,"n":100,"one_way_p50_us":40.0,"one_way_p99_us":40.0,"rtt_p50_us":80.0,"measured_one_way_p50_us":20.0,"measured_one_way_p99_us":30.0}
"#;

    #[test]
    fn malformed_lines_are_skipped_with_a_warning() {
        let text = "SKIPPED torch_ipc_latency: no GPU\n\n{\"bench\":\"latency\",\"path\":\"p\",\"size\":8,\"one_way_p50_us\":1.5}\n[1,2]\n{\"bench\": \"latency\", \"cut";
        let mut warnings = Vec::new();
        let recs = parse_jsonl("x.jsonl", text, &mut warnings);
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].num("one_way_p50_us"), Some(1.5));
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings[0].starts_with("x.jsonl:1: not a JSON object"), "{warnings:?}");
        assert!(warnings[1].starts_with("x.jsonl:4:"), "{warnings:?}");
        assert!(warnings[2].starts_with("x.jsonl:5:"), "{warnings:?}");
    }

    #[test]
    fn python_nan_reads_as_not_measured() {
        let line = r#"{"bench": "latency", "path": "a NaN path", "size": 0, "one_way_p50_us": NaN, "rtt_p50_us": -Infinity, "x": [NaN, 1]}"#;
        assert_eq!(
            non_finite_to_null(line),
            r#"{"bench": "latency", "path": "a NaN path", "size": 0, "one_way_p50_us": null, "rtt_p50_us": null, "x": [null, 1]}"#
        );
        let (recs, data, warnings) = data_of(&[("t.jsonl", line)]);
        assert_eq!(recs.len(), 1);
        assert!(data.latency.is_empty(), "a row without its p50 is not a table row");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
    }

    #[test]
    fn latency_goals_are_computed_from_the_rows() {
        let (_, d, warnings) = data_of(&[("zcs_latency.jsonl", LATENCY)]);
        assert!(warnings.is_empty(), "{warnings:?}");
        let g = goals(&d);
        // p50: 44/40 = 1.10 and 50/40 = 1.25 → one size over 1.2.
        let p50 = goal(&g, "Zero-copy ÷ 64 B `zenoh-plain`, p50, one way");
        assert_eq!(p50.status, Status::NotMet);
        assert!(p50.measured.contains("4 KiB 1.10×") && p50.measured.contains("32 MiB 1.25×"), "{}", p50.measured);
        // p99: 70/40 = 1.75, 90/40 = 2.25.
        assert_eq!(goal(&g, "Zero-copy ÷ 64 B `zenoh-plain`, p99, one way").status, Status::NotMet);
        // Measured: 30/20 = 1.5 → not met; p99 50/30, 45/30 ≤ 2 → met.
        assert_eq!(goal(&g, "Zero-copy ÷ 64 B `zenoh-plain`, p50, measured").status, Status::NotMet);
        assert_eq!(goal(&g, "Zero-copy ÷ 64 B `zenoh-plain`, p99, measured").status, Status::Met);
        // 2600 / 50 = 52× ≥ 50.
        let copy = goal(&g, "Best copy path");
        assert_eq!(copy.status, Status::Met);
        assert!(copy.measured.contains("52.0×") && copy.measured.contains("`cpu-bytes`"), "{}", copy.measured);
        // Nothing else was in the run.
        for prefix in ["4K RGBA", "First message", "Round trip vs torch", "Round trip vs the cuda.core"] {
            for x in g.iter().filter(|x| x.goal.starts_with(prefix)) {
                assert_eq!(x.status, Status::NotMeasured, "{}", x.goal);
                assert!(x.measured.starts_with("not measured"), "{}", x.measured);
            }
        }
    }

    #[test]
    fn peer_goals_and_peer_copy_is_not_a_copy_path() {
        let lat = r#"{"bench":"latency","path":"zero-copy","size":33554432,"one_way_p50_us":24.0}
{"bench":"latency","path":"zero-copy-peer","size":33554432,"one_way_p50_us":26.0}
{"bench":"latency","path":"peer-copy","size":33554432,"one_way_p50_us":60.0}
{"bench":"latency","path":"cpu-bytes","size":33554432,"one_way_p50_us":18000.0}"#;
        let peer = r#"{"bench":"peer-bandwidth","path":"zero-copy-peer-read","size":1048576,"p50_us":25.0}
{"bench":"peer-bandwidth","path":"peer-copy-raw","size":1048576,"p50_us":11.0}
{"bench":"peer-bandwidth","path":"zero-copy-peer-read","size":33554432,"p50_us":110.0}
{"bench":"peer-bandwidth","path":"peer-copy-raw","size":33554432,"p50_us":94.0}"#;
        let (_, d, warnings) = data_of(&[("zcs_latency.jsonl", lat), ("zcs_peer_bench.jsonl", peer)]);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert!(goal_copy(&d).measured.starts_with("`cpu-bytes`"), "{}", goal_copy(&d).measured);
        assert_eq!(goal_peer_latency(&d).status, Status::Met);
        // Judged from 32 MiB only: 85 % there, 44 % at 1 MiB (shown, not judged).
        let read = goal_peer_read(&d);
        assert_eq!(read.status, Status::Met);
        assert!(read.measured.contains("1 MiB 44 %") && read.measured.contains("32 MiB 85 %"), "{}", read.measured);
        let slow = lat.replace("\"one_way_p50_us\":26.0", "\"one_way_p50_us\":30.0");
        let (_, d, _) = data_of(&[("zcs_latency.jsonl", &slow)]);
        assert_eq!(goal_peer_latency(&d).status, Status::NotMet);
        assert_eq!(goal_peer_read(&d).status, Status::NotMeasured);
        assert_eq!(goal_4k_peer(&d).status, Status::NotMeasured);
    }

    #[test]
    fn cross_host_goal_compares_each_cell_with_the_link_anchor() {
        let rows = format!(
            r#"{{"bench":"throughput","path":"cross-host","size":{FRAME_4K_RGBA},"subscribers":1,"msgs_per_s":80.0,"errors":0,"lost":0}}
{{"bench":"throughput","path":"zenoh-host-cross-host","size":{FRAME_4K_RGBA},"subscribers":1,"msgs_per_s":100.0,"errors":0,"lost":0}}
{{"bench":"throughput","path":"cross-host","size":{FRAME_1080P_RGB},"subscribers":1,"msgs_per_s":300.0,"errors":0,"lost":0}}"#
        );
        let (_, d, warnings) = data_of(&[("zcs_throughput_cross_host.jsonl", &rows)]);
        assert!(warnings.is_empty(), "{warnings:?}");
        let g = goal_cross_host(&d);
        // Only the cell both rows have is judged: 80 of 100.
        assert_eq!(g.status, Status::Met, "{}", g.measured);
        assert_eq!(g.measured, "4K RGBA × 1: 80 % (80.0 of 100)");
        let slow = rows.replace("\"msgs_per_s\":80.0", "\"msgs_per_s\":60.0");
        assert_eq!(goal_cross_host(&data_of(&[("t.jsonl", &slow)]).1).status, Status::NotMet);
        let ours_only = rows.lines().next().unwrap();
        assert_eq!(goal_cross_host(&data_of(&[("t.jsonl", ours_only)]).1).status, Status::NotMeasured);
    }

    #[test]
    fn host_block_goal_is_judged_at_32_mib_against_the_pinned_copy() {
        let lat = r#"{"bench":"latency","path":"zero-copy","size":33554432,"one_way_p50_us":24.0}
{"bench":"latency","path":"host-block","size":4096,"one_way_p50_us":40.0,"measured_one_way_p50_us":30.0}
{"bench":"latency","path":"d2h-pinned","size":4096,"one_way_p50_us":8.0,"measured_one_way_p50_us":8.0}
{"bench":"latency","path":"host-block","size":33554432,"one_way_p50_us":800.0,"measured_one_way_p50_us":720.0}
{"bench":"latency","path":"d2h-pinned","size":33554432,"one_way_p50_us":600.0,"measured_one_way_p50_us":600.0}
{"bench":"latency","path":"cpu-bytes","size":33554432,"one_way_p50_us":18000.0}"#;
        let (_, d, warnings) = data_of(&[("zcs_latency.jsonl", lat)]);
        assert!(warnings.is_empty(), "{warnings:?}");
        // 1.2× at 32 MiB is met; 3.75× at 4 KiB is shown, not judged.
        let g = goal_host_block(&d);
        assert_eq!(g.status, Status::Met, "{}", g.measured);
        assert!(g.measured.contains("4 KiB 3.75×") && g.measured.contains("32 MiB 1.20×"), "{}", g.measured);
        // Neither row is a copy path of a GPU consumer.
        assert!(goal_copy(&d).measured.starts_with("`cpu-bytes`"), "{}", goal_copy(&d).measured);
        let slow = lat.replace("\"measured_one_way_p50_us\":720.0", "\"measured_one_way_p50_us\":900.0");
        assert_eq!(goal_host_block(&data_of(&[("zcs_latency.jsonl", &slow)]).1).status, Status::NotMet);
        let (_, d, _) = data_of(&[("zcs_latency.jsonl", lat.lines().next().unwrap())]);
        assert_eq!(goal_host_block(&d).status, Status::NotMeasured);
    }

    #[test]
    fn flat_goal_is_met_under_the_target_and_needs_the_plain_row() {
        let ok = r#"{"bench":"latency","path":"zero-copy","size":4096,"one_way_p50_us":47.0,"one_way_p99_us":79.0}
{"bench":"latency","path":"zenoh-plain","size":64,"one_way_p50_us":40.0,"one_way_p99_us":40.0}"#;
        let (_, d, _) = data_of(&[("zcs_latency.jsonl", ok)]);
        assert_eq!(goal_flat(&d, Stat::P50, "g", GOAL_FLAT_P50).status, Status::Met);
        assert_eq!(goal_flat(&d, Stat::P99, "g", GOAL_FLAT_P99).status, Status::Met);
        // No measured figures in an older run: not measured, not zero.
        let m = goal_flat(&d, Stat::MeasuredP50, "g", GOAL_FLAT_P50);
        assert_eq!(m.status, Status::NotMeasured);
        assert!(m.measured.starts_with("not measured"));
        let (_, d, _) = data_of(&[("zcs_latency.jsonl", ok.lines().next().unwrap())]);
        assert_eq!(goal_flat(&d, Stat::P50, "g", GOAL_FLAT_P50).status, Status::NotMeasured);
    }

    #[test]
    fn throughput_first_message_and_anchor_goals() {
        let tput = format!(
            r#"{{"bench":"throughput-setup","backend":"cuda-vmm"}}
{{"bench":"throughput","path":"zero-copy","size":{FRAME_4K_RGBA},"subscribers":1,"msgs_per_s":5200.0,"gb_per_s":172.5,"errors":0,"lost":0}}
{{"bench":"throughput","path":"zero-copy","size":{FRAME_4K_RGBA},"subscribers":4,"msgs_per_s":1999.0,"errors":0,"lost":3}}
{{"bench":"first-message","path":"zero-copy","size":1048576,"subscribers":10,"rate_hz":1000.0,"first_ready_p50_us":1700.0,"first_ready_max_us":2600.0,"setup_p50_us":950.0,"setup_max_us":2000.0,"linked_p50_us":700.0,"first_zero_copy_net_p50_us":250.0}}"#
        );
        let torch = r#"{"bench": "latency-setup", "script": "torch_ipc_latency"}
{"bench": "latency", "path": "torch-mp-ipc-hold", "size": 33554432, "n": 200, "one_way_p50_us": 600.0, "rtt_p50_us": 1200.0}
{"bench": "latency", "path": "torch-mp-ipc-drop", "size": 1048576, "n": 200, "one_way_p50_us": 600.0, "rtt_p50_us": 1200.0}"#;
        let cc = r#"{"bench": "latency-setup", "script": "cuda_core_ipc_latency"}
{"bench": "latency", "path": "cuda-core-ipc-hold", "size": 4096, "one_way_p50_us": 40.0, "rtt_p50_us": 80.0}"#;
        let (_, d, warnings) = data_of(&[
            ("zcs_latency.jsonl", LATENCY),
            ("zcs_throughput.jsonl", &tput),
            ("t.jsonl", torch),
            ("c.jsonl", cc),
        ]);
        assert!(warnings.is_empty(), "{warnings:?}");
        let g = goals(&d);
        assert_eq!(goal(&g, "4K RGBA zero-copy msgs/s, 1 subscriber").status, Status::Met);
        assert_eq!(goal(&g, "4K RGBA zero-copy msgs/s to each of 4").status, Status::NotMet);
        // The goal reads link up + first trip (950 µs), not the wait for a frame at 1 kHz.
        let first = goal(&g, "First message");
        assert_eq!(first.status, Status::Met, "{}", first.measured);
        assert!(first.measured.contains("1.70 ms with a frame every 1.00 ms"), "{}", first.measured);
        // torch hold at 32 MiB: 1200 / 100 = 12× → met; drop shares no size with zero-copy.
        let hold = goal(&g, "Round trip vs torch.multiprocessing, tensors kept");
        assert_eq!(hold.status, Status::Met, "{}", hold.measured);
        assert!(hold.measured.contains("12.0×"), "{}", hold.measured);
        assert_eq!(goal(&g, "Round trip vs torch.multiprocessing, tensors dropped").status, Status::NotMeasured);
        // cuda.core hold at 4 KiB: 80 / 88 < 1 → ours is not lower.
        assert_eq!(goal(&g, "Round trip vs the cuda.core IPC pool (hold)").status, Status::NotMet);
        // The anchors are not mixed into our latency table.
        assert!(d.lat("torch-mp-ipc-hold", true).is_some() && d.lat("torch-mp-ipc-hold", false).is_none());
        let md = report_md(&Run::default(), &d, &g);
        assert!(md.contains("`zero-copy` 4K RGBA, 4 subs: 0 errors, 3 lost"), "{md}");
        assert!(md.contains("| `zero-copy` | 5,200 (173) | 1,999 |"), "{md}");
    }

    #[test]
    fn missing_sections_say_not_measured() {
        let (_, d, _) = data_of(&[(
            "zcs_pool_bench.jsonl",
            r#"{"bench":"import_map_cold","backend":"cuda-vmm","ns":201892.0,"size":2097152}"#,
        )]);
        let g = goals(&d);
        assert!(g.iter().all(|x| x.status == Status::NotMeasured));
        let md = report_md(&Run::default(), &d, &g);
        for section in [
            "no `latency` rows",
            "no latency rows from the Python",
            "no `d2d-copy`",
            "no `throughput`",
            "no `first-message`",
        ] {
            assert!(md.contains(section), "{section}: {md}");
        }
        assert!(md.contains("| `import_map_cold` (cuda-vmm) | 202 | 1 |"), "{md}");
        assert!(md.contains("Machine: not recorded"));
        let j = run_json(&Run::default(), &g);
        assert_eq!(j["machine"], Value::Null);
        assert!(j["goals"].as_array().unwrap().iter().all(|x| x["status"] == "not measured"));
    }

    #[test]
    fn zenoh_shm_rows_join_the_tables_and_plots_as_zenohs_own() {
        let shm = format!(
            r#"{{"bench":"zenoh-shm-setup","backend":"cuda","gpu":"G","host_registered":true,"shm":"posix"}}
{{"bench":"latency","path":"zenoh-shm","backend":"cuda","size":33554432,"n":100,"one_way_p50_us":1500.0,"one_way_p99_us":1900.0,"rtt_p50_us":3000.0,"measured_one_way_p50_us":1400.0,"measured_one_way_p99_us":1800.0}}
{{"bench":"latency","path":"zenoh-shm","backend":"cuda","size":1073741824,"skipped":"the SHM pool for this size could not be created: no room"}}
{{"bench":"throughput","path":"zenoh-shm-user-copies","backend":"cuda","size":{FRAME_4K_RGBA},"subscribers":1,"msgs_per_s":300.0,"gb_per_s":9.95,"errors":0,"lost":0}}"#
        );
        // A provider run's zero-copy row is not a copy path.
        let provider = r#"{"bench":"latency","path":"zero-copy-provider","backend":"cuda-vmm","size":33554432,"one_way_p50_us":49.0,"rtt_p50_us":98.0}"#;
        let (_, d, warnings) = data_of(&[
            ("zcs_latency.jsonl", LATENCY),
            ("zcs_latency_provider.jsonl", provider),
            ("zcs_zenoh_shm.jsonl", &shm),
        ]);
        assert!(warnings.is_empty(), "a skipped row is not a warning: {warnings:?}");
        let g = goals(&d);
        // 1500 / 50 = 30×: zenoh-shm is now the best copy path, and it falls short.
        let copy = goal(&g, "Best copy path");
        assert_eq!(copy.status, Status::NotMet, "{}", copy.measured);
        assert!(copy.measured.contains("`zenoh-shm` 1,500 µs") && copy.measured.contains("30.0×"), "{}", copy.measured);
        let md = report_md(&Run::default(), &d, &g);
        assert!(md.contains("| `zenoh-shm` (cuda), one way = RTT/2 |"), "{md}");
        assert!(md.contains("- `zenoh-shm` 1 GiB: the SHM pool for this size could not be created: no room"), "{md}");
        assert!(md.contains("| `zenoh-shm-user-copies` | 300 (9.95) |"), "{md}");
        assert!(
            md.contains("Setup (zcs_zenoh_shm.jsonl): backend cuda; gpu G; shm posix; host_registered true."),
            "{md}"
        );
        let labels: Vec<String> = latency_series(&d).into_iter().map(|s| s.label).collect();
        assert!(labels.contains(&"zenoh-shm (RTT/2)".to_owned()), "{labels:?}");
        assert!(labels.contains(&"ours, zero-copy-provider (RTT/2)".to_owned()), "{labels:?}");
    }

    #[test]
    fn duplicate_rows_keep_the_first_and_warn() {
        let text = r#"{"bench":"latency","path":"zero-copy","size":64,"one_way_p50_us":1.0}
{"bench":"latency","path":"zero-copy","size":64,"one_way_p50_us":2.0}"#;
        let (_, d, warnings) = data_of(&[("a.jsonl", text)]);
        assert_eq!(d.latency[0].cells[&64].p50, 1.0);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
    }

    #[test]
    fn machine_csv_and_formatting() {
        let m = parse_machine("name, memory.total [MiB], driver_version\nNVIDIA H200, 143771 MiB, 580.159.04\nextra\n");
        assert_eq!(m.fields[0], ("name".to_owned(), "NVIDIA H200".to_owned()));
        assert_eq!(m.fields[2].1, "580.159.04");
        assert!(parse_machine("nvidia-smi: not found\n").fields.is_empty());
        assert_eq!(human_size(64), "64 B");
        assert_eq!(human_size(4096), "4 KiB");
        assert_eq!(human_size(32 << 20), "32 MiB");
        assert_eq!(frame_label(FRAME_4K_RGBA), "4K RGBA");
        assert_eq!(fmt_num(15800.4), "15,800");
        assert_eq!(fmt_num(51.23), "51.2");
        assert_eq!(fmt_num(0.873), "0.87");
        assert_eq!(fmt_ratio(341.2), "341×");
        assert_eq!(fmt_us(3900.0), "3.90 ms");
        let k = log10_keys(0.5, 2.1);
        assert_eq!(k.len(), 5, "{k:?}"); // 5, 10, 20, 50, 100
    }

    #[test]
    fn latency_series_put_ours_first_and_skip_the_floors() {
        let anchors = r#"{"bench": "latency-setup", "script": "torch_ipc_latency"}
{"bench": "latency", "path": "torch-mp-plain", "size": 0, "one_way_p50_us": 30.0}
{"bench": "latency", "path": "torch-mp-ipc-hold", "size": 1048576, "one_way_p50_us": 90.0}"#;
        let (_, d, _) = data_of(&[("a.jsonl", anchors), ("zcs_latency.jsonl", LATENCY)]);
        let labels: Vec<String> = latency_series(&d).into_iter().map(|s| s.label).collect();
        assert_eq!(
            labels,
            [
                "ours, zero-copy (RTT/2)",
                "ours, zero-copy (measured)",
                "ours, cpu-bytes (RTT/2)",
                "torch-mp-ipc-hold (RTT/2)"
            ]
        );
    }
}
