//! The QoS profile of a ROS publisher or subscription, as rclcpp users set it:
//! reliability, durability and history (keep last `depth`, or keep all). The values
//! are those of `rmw/types.h`.

use zenoh_cuda_shm_ros2::{Durability, History, Qos, Reliability};

use crate::error::{Error, ZCS_ERR_INVALID, guard, non_null, set_out, zcs_result_t};

/// `zcs_ros_qos_t::reliability`: every message is delivered (rmw's RELIABLE).
pub const ZCS_ROS_RELIABILITY_RELIABLE: u32 = 1;
/// `zcs_ros_qos_t::reliability`: messages may be dropped (rmw's BEST_EFFORT).
pub const ZCS_ROS_RELIABILITY_BEST_EFFORT: u32 = 2;
/// `zcs_ros_qos_t::durability`: late-joining subscriptions get up to `depth` past
/// messages (rmw's TRANSIENT_LOCAL).
pub const ZCS_ROS_DURABILITY_TRANSIENT_LOCAL: u32 = 1;
/// `zcs_ros_qos_t::durability`: only messages published after a subscription joined
/// (rmw's VOLATILE).
pub const ZCS_ROS_DURABILITY_VOLATILE: u32 = 2;
/// `zcs_ros_qos_t::history`: keep the last `depth` messages (rmw's KEEP_LAST).
pub const ZCS_ROS_HISTORY_KEEP_LAST: u32 = 1;
/// `zcs_ros_qos_t::history`: keep every message (rmw's KEEP_ALL): a reliable publisher
/// then blocks instead of dropping when a subscription falls behind.
pub const ZCS_ROS_HISTORY_KEEP_ALL: u32 = 2;

/// A QoS profile. `zcs_ros_qos_default` fills rclcpp's default (`rclcpp::QoS(10)`:
/// reliable, volatile, keep last 10), `zcs_ros_qos_sensor_data` rclcpp's
/// `SensorDataQoS` (best effort, volatile, keep last 5); change fields from there.
/// Deadline, lifespan and liveliness lease are infinite, liveliness automatic.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct zcs_ros_qos_t {
    /// `ZCS_ROS_RELIABILITY_RELIABLE` or `ZCS_ROS_RELIABILITY_BEST_EFFORT`.
    pub reliability: u32,
    /// `ZCS_ROS_DURABILITY_VOLATILE` or `ZCS_ROS_DURABILITY_TRANSIENT_LOCAL`.
    pub durability: u32,
    /// `ZCS_ROS_HISTORY_KEEP_LAST` or `ZCS_ROS_HISTORY_KEEP_ALL`.
    pub history: u32,
    /// Messages kept with `ZCS_ROS_HISTORY_KEEP_LAST` (at least 1); ignored with
    /// `ZCS_ROS_HISTORY_KEEP_ALL`. A keep-last subscription queues this many received
    /// messages and then drops the oldest; a keep-all one queues without limit.
    pub depth: u32,
}

impl zcs_ros_qos_t {
    fn from_rust(q: Qos) -> Self {
        let (history, depth) = match q.history {
            History::KeepLast(d) => (ZCS_ROS_HISTORY_KEEP_LAST, d),
            History::KeepAll => (ZCS_ROS_HISTORY_KEEP_ALL, q.depth()),
        };
        Self { reliability: q.reliability as u32, durability: q.durability as u32, history, depth }
    }
}

/// The profile at `qos` (NULL: the default profile), checked: a value that is none of
/// the constants, or a depth of 0 with keep last, is `ZCS_ERR_INVALID`.
///
/// # Safety
/// `qos` is NULL or points to a readable `zcs_ros_qos_t`.
pub(crate) unsafe fn qos_in(qos: *const zcs_ros_qos_t) -> Result<Qos, Error> {
    if qos.is_null() {
        return Ok(Qos::reliable(10));
    }
    // SAFETY: not null (checked); readable (the caller's contract).
    let q = unsafe { *qos };
    let invalid = |field: &str, value: u32, allowed: &str| {
        Error::new(ZCS_ERR_INVALID, format!("qos.{field} is {value}, not one of {allowed}"))
    };
    let reliability = match q.reliability {
        ZCS_ROS_RELIABILITY_RELIABLE => Reliability::Reliable,
        ZCS_ROS_RELIABILITY_BEST_EFFORT => Reliability::BestEffort,
        v => {
            return Err(invalid(
                "reliability",
                v,
                "ZCS_ROS_RELIABILITY_RELIABLE (1), ZCS_ROS_RELIABILITY_BEST_EFFORT (2)",
            ));
        }
    };
    let durability = match q.durability {
        ZCS_ROS_DURABILITY_VOLATILE => Durability::Volatile,
        ZCS_ROS_DURABILITY_TRANSIENT_LOCAL => Durability::TransientLocal,
        v => {
            return Err(invalid(
                "durability",
                v,
                "ZCS_ROS_DURABILITY_TRANSIENT_LOCAL (1), ZCS_ROS_DURABILITY_VOLATILE (2)",
            ));
        }
    };
    let history = match q.history {
        ZCS_ROS_HISTORY_KEEP_LAST if q.depth == 0 => {
            return Err(Error::new(ZCS_ERR_INVALID, "qos.depth is 0 with ZCS_ROS_HISTORY_KEEP_LAST: it keeps nothing"));
        }
        ZCS_ROS_HISTORY_KEEP_LAST => History::KeepLast(q.depth),
        ZCS_ROS_HISTORY_KEEP_ALL => History::KeepAll,
        v => return Err(invalid("history", v, "ZCS_ROS_HISTORY_KEEP_LAST (1), ZCS_ROS_HISTORY_KEEP_ALL (2)")),
    };
    Ok(Qos { reliability, durability, history, ..Qos::default() })
}

fn fill(out: *mut zcs_ros_qos_t, q: Qos) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        // SAFETY: not null (checked); the caller passes a writable profile.
        unsafe { set_out(out, zcs_ros_qos_t::from_rust(q)) };
        Ok(())
    })
}

/// Writes rclcpp's default profile (`rclcpp::QoS(10)`): reliable, volatile, keep last
/// 10. A NULL profile in a declaration means this one.
///
/// # Safety
/// `out` is NULL or points to a writable `zcs_ros_qos_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_qos_default(out: *mut zcs_ros_qos_t) -> zcs_result_t {
    fill(out, Qos::reliable(10))
}

/// Writes rclcpp's `SensorDataQoS`: best effort, volatile, keep last 5.
///
/// # Safety
/// `out` is NULL or points to a writable `zcs_ros_qos_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_qos_sensor_data(out: *mut zcs_ros_qos_t) -> zcs_result_t {
    fill(out, Qos::sensor_data())
}
