//! ROS 2's listener demo as our node: `std_msgs/msg/String` "Hello World: N" on `chatter`.
//! See docs/ros2.md.
//!
//! ```text
//! cargo run --release -p zcs-examples --example ros2_listener -- -e tcp/127.0.0.1:7447 -n 5
//! ```

use std::process::ExitCode;

use clap::Parser;
use zcs_examples::chatter::{ListenerArgs, run_listener};
use zcs_examples::ros2::RosArgs;
use zcs_examples::{CommonArgs, exit_status, init_logging};

#[derive(Parser)]
#[command(about = "zenoh-cuda-shm ROS 2 listener (std_msgs/msg/String on chatter, rmw_zenoh compatible)")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    ros: RosArgs,
    #[command(flatten)]
    args: ListenerArgs,
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    exit_status(run_listener(&cli.common, &cli.ros, &cli.args))
}
