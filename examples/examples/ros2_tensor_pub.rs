//! ROS 2 tensor publisher over rmw_zenoh (GPU data: zero-copy to our subscribers on the same GPU, CDR to ordinary ROS subscribers).
//! See docs/ros2.md.
//!
//! ```text
//! cargo run --release -p zcs-examples --example ros2_tensor_pub -- -e tcp/127.0.0.1:7447
//! ```

use std::process::ExitCode;

use clap::Parser;
use zcs_examples::ros2::{Kind, RosArgs, RosPubArgs, run_pub};
use zcs_examples::{CommonArgs, exit_status, init_logging};

#[derive(Parser)]
#[command(about = "zenoh-cuda-shm ROS 2 tensor publisher (rmw_zenoh compatible)")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    ros: RosArgs,
    #[command(flatten)]
    args: RosPubArgs,
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    exit_status(run_pub(Kind::Tensor, &cli.common, &cli.ros, &cli.args))
}
