//! ROS 2 tensor subscriber over rmw_zenoh (zero-copy from our publishers, CDR from ordinary ROS publishers; every byte checked).
//! See docs/ros2.md.
//!
//! ```text
//! cargo run --release -p zcs-examples --example ros2_tensor_sub -- -e tcp/127.0.0.1:7447 -n 100
//! ```

use std::process::ExitCode;

use clap::Parser;
use zcs_examples::ros2::{Kind, RosArgs, RosSubArgs, run_sub};
use zcs_examples::{CommonArgs, exit_status, init_logging};

#[derive(Parser)]
#[command(about = "zenoh-cuda-shm ROS 2 tensor subscriber (rmw_zenoh compatible)")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    ros: RosArgs,
    #[command(flatten)]
    args: RosSubArgs,
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    exit_status(run_sub(Kind::Tensor, &cli.common, &cli.ros, &cli.args))
}
