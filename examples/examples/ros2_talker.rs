//! ROS 2's talker demo as our node: `std_msgs/msg/String` "Hello World: N" on `chatter`.
//! See docs/ros2.md.
//!
//! ```text
//! cargo run --release -p zcs-examples --example ros2_talker -- -e tcp/127.0.0.1:7447
//! ```

use std::process::ExitCode;

use clap::Parser;
use zcs_examples::chatter::{TalkerArgs, run_talker};
use zcs_examples::ros2::RosArgs;
use zcs_examples::{CommonArgs, exit_status, init_logging};

#[derive(Parser)]
#[command(about = "zenoh-cuda-shm ROS 2 talker (std_msgs/msg/String on chatter, rmw_zenoh compatible)")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    ros: RosArgs,
    #[command(flatten)]
    args: TalkerArgs,
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    exit_status(run_talker(&cli.common, &cli.ros, &cli.args))
}
