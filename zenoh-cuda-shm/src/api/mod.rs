//! The public API, in the style of Zenoh 1.x: a session, builders that resolve with
//! `.wait()` or `.await`, publishers that loan blocks and subscribers with callback or
//! channel handlers.
//!
//! ```no_run
//! use zenoh_cuda_shm::{GpuSession, ZcsConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let session = GpuSession::open(zenoh::Config::default(), ZcsConfig::default()).wait()?;
//! println!("blocks live in {}", session.backend()); // cuda-vmm, or host-memfd without a GPU
//!
//! let subscriber = session.declare_subscriber("demo/tensor").wait()?;
//! let publisher = session.declare_publisher("demo/tensor").wait()?;
//!
//! let mut loan = publisher.loan(8 << 20)?;
//! loan.write_bytes(0, &vec![7u8; 8 << 20])?; // or launch kernels on loan.device_ptr()
//! publisher.put(loan)?;
//!
//! let sample = subscriber.recv()?;
//! println!("{} bytes by the {} path", sample.len(), sample.path());
//! # Ok(()) }
//! ```

mod publisher;
mod reach;
mod reports;
mod session;
mod shared_block;
mod subscriber;

pub use publisher::*;
pub use session::*;
pub use shared_block::{Allocation, DeviceAllocation, SharedBlock};
pub use subscriber::*;

use reach::{names_connect_endpoints, wait_for_a_link, warn_if_unreached};
use reports::{Reporter, Reports, lock_reports, send_reports};
use session::SessionInner;
