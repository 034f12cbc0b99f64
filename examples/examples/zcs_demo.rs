//! The one-command demo: starts a subscriber process and a publisher process on this
//! machine, connected over loopback Zenoh, and shows the path they negotiate — zero-copy
//! on a GPU, zero-copy host memory without one — with every byte checked.
//!
//! ```text
//! cargo run --release -p zcs-examples --example zcs_demo
//! ```

use std::process::{Command, ExitCode};
use std::time::Duration;

use clap::Parser;
use zcs_examples::{CommonArgs, PubArgs, SubArgs, exit_status, init_logging, run_pub, run_sub};

#[derive(Parser)]
#[command(about = "zenoh-cuda-shm demo: a publisher and a subscriber process")]
struct Cli {
    /// Messages to send.
    #[arg(short = 'n', long, default_value_t = 50)]
    count: u64,
    /// Payload size in bytes.
    #[arg(short, long, default_value_t = 8 << 20)]
    size: usize,
    /// Internal: the role of a child process.
    #[arg(long, hide = true)]
    role: Option<String>,
    /// Internal: the loopback port.
    #[arg(long, hide = true, default_value_t = 0)]
    port: u16,
}

fn common(port: u16, listen: bool) -> CommonArgs {
    let ep = format!("tcp/127.0.0.1:{port}");
    CommonArgs {
        mode: "peer".into(),
        connect: if listen { vec![] } else { vec![ep.clone()] },
        listen: if listen { vec![ep] } else { vec![] },
        no_multicast_scouting: true,
        config: None,
        zcs_config: None,
        device: None,
    }
}

fn main() -> ExitCode {
    init_logging();
    exit_status(run(Cli::parse()))
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let key = "demo/zcs/frame".to_owned();
    match cli.role.as_deref() {
        Some("sub") => {
            let args = SubArgs { key, count: cli.count, no_check: false, idle_timeout: 30 };
            return run_sub(&common(cli.port, true), &args);
        }
        Some("pub") => {
            let args = PubArgs { key, size: cli.size, rate: 20.0, count: cli.count, wait_zero_copy: 1 };
            return run_pub(&common(cli.port, false), &args);
        }
        _ => {}
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let exe = std::env::current_exe()?;
    let spawn = |role: &str| {
        Command::new(&exe)
            .args([
                "--role",
                role,
                "--port",
                &port.to_string(),
                "-n",
                &cli.count.to_string(),
                "-s",
                &cli.size.to_string(),
            ])
            .spawn()
    };
    let mut sub = spawn("sub")?;
    std::thread::sleep(Duration::from_millis(500));
    let mut publ = spawn("pub")?;
    let ps = publ.wait()?;
    let ss = sub.wait()?;
    if !(ps.success() && ss.success()) {
        return Err(format!("publisher: {ps}, subscriber: {ss}").into());
    }
    println!("[demo] ok: {} messages of {} bytes published and checked in another process", cli.count, cli.size);
    Ok(())
}
