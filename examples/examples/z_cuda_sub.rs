//! Subscribes over zenoh-cuda-shm, checks every byte of every frame, and prints the
//! path each publisher negotiated (zero-copy, cpu-bytes, inline, plain).
//!
//! ```text
//! cargo run --release -p zcs-examples --example z_cuda_sub -- -k camera/front
//! ```

use std::process::ExitCode;

use clap::Parser;
use zcs_examples::{CommonArgs, SubArgs, exit_status, init_logging, run_sub};

#[derive(Parser)]
#[command(about = "zenoh-cuda-shm subscriber (like z_sub)")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    args: SubArgs,
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    exit_status(run_sub(&cli.common, &cli.args))
}
