//! Publishes frames over zenoh-cuda-shm: zero-copy to subscribers on the same GPU (or,
//! without a GPU, the same host), bytes to everyone else.
//!
//! ```text
//! cargo run --release -p zcs-examples --example z_cuda_pub -- -k camera/front -s 8294400 -r 30
//! ```

use std::process::ExitCode;

use clap::Parser;
use zcs_examples::{CommonArgs, PubArgs, exit_status, init_logging, run_pub};

#[derive(Parser)]
#[command(about = "zenoh-cuda-shm publisher (like z_pub)")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    args: PubArgs,
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    exit_status(run_pub(&cli.common, &cli.args))
}
