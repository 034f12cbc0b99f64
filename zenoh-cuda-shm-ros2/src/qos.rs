//! QoS as rmw_zenoh writes it in liveliness tokens: the profile, its compact key-expression
//! form, and the canonical form rmw_zenoh rebuilds after parsing.

use std::fmt::Write as _;
use std::time::Duration;

/// rmw_zenoh's default history depth (an empty depth in a QoS component means this).
pub const DEFAULT_DEPTH: u32 = 42;

/// QoS reliability (values of `rmw/types.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reliability {
    /// `1`: every sample is delivered (Zenoh reliable channel).
    Reliable = 1,
    /// `2`: samples may be dropped.
    BestEffort = 2,
}

/// QoS durability (values of `rmw/types.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Durability {
    /// `1`: late joiners receive up to `depth` past samples (zenoh-ext Advanced pub/sub).
    TransientLocal = 1,
    /// `2`: only samples published after the subscriber joined.
    Volatile = 2,
}

/// QoS history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum History {
    /// `1`: keep the last `depth` samples.
    KeepLast(u32),
    /// `2`: keep everything (reliable publishers then block instead of dropping).
    KeepAll,
}

/// QoS liveliness kind (values of `rmw/types.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Liveliness {
    /// `1`.
    Automatic = 1,
    /// `3`.
    ManualByTopic = 3,
}

/// An endpoint's QoS, as carried in its liveliness token. `Default` is rmw_zenoh's
/// default profile (reliable, volatile, keep last 42, everything infinite, automatic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Qos {
    /// Reliability.
    pub reliability: Reliability,
    /// Durability.
    pub durability: Durability,
    /// History kind and depth.
    pub history: History,
    /// Deadline (`None`: infinite).
    pub deadline: Option<Duration>,
    /// Lifespan (`None`: infinite).
    pub lifespan: Option<Duration>,
    /// Liveliness kind.
    pub liveliness: Liveliness,
    /// Liveliness lease duration (`None`: infinite).
    pub lease: Option<Duration>,
}

impl Default for Qos {
    fn default() -> Self {
        Self {
            reliability: Reliability::Reliable,
            durability: Durability::Volatile,
            history: History::KeepLast(DEFAULT_DEPTH),
            deadline: None,
            lifespan: None,
            liveliness: Liveliness::Automatic,
            lease: None,
        }
    }
}

impl Qos {
    /// Reliable, volatile, keep last `depth` (rclcpp's `QoS(depth)`).
    pub fn reliable(depth: u32) -> Self {
        Self { history: History::KeepLast(depth), ..Self::default() }
    }

    /// ROS's `SensorDataQoS`: best effort, volatile, keep last 5.
    pub fn sensor_data() -> Self {
        Self { reliability: Reliability::BestEffort, history: History::KeepLast(5), ..Self::default() }
    }

    /// Reliable, transient local, keep last `depth` (latched topics).
    pub fn transient_local(depth: u32) -> Self {
        Self { durability: Durability::TransientLocal, history: History::KeepLast(depth), ..Self::default() }
    }

    /// Keep all samples.
    pub fn keep_all(mut self) -> Self {
        self.history = History::KeepAll;
        self
    }

    /// The depth (`KEEP_ALL` reports rmw_zenoh's default depth, as rmw does).
    pub fn depth(&self) -> u32 {
        match self.history {
            History::KeepLast(d) => d,
            History::KeepAll => DEFAULT_DEPTH,
        }
    }

    /// The QoS component as this crate declares it: reliability, durability, history
    /// kind and depth, and liveliness kind always written out; deadline, lifespan and
    /// lease empty when infinite. Explicit values cannot be misread by rmw_zenoh
    /// releases whose defaults differ (Jazzy ≤ 0.2.2 read an empty durability as
    /// transient local), e.g. `1:2:1,10:,:,:1,,`.
    pub fn to_keyexpr(&self) -> String {
        self.encode(false)
    }

    /// The QoS component exactly as rmw_zenoh writes it: every field equal to its
    /// default profile left empty, e.g. `::,10:,:,:,,` for reliable, volatile, keep last 10.
    pub fn to_keyexpr_compact(&self) -> String {
        self.encode(true)
    }

    fn encode(&self, compact: bool) -> String {
        let d = Self::default();
        let mut s = String::with_capacity(24);
        let num = |s: &mut String, v: u64, default: bool| {
            if !(compact && default) {
                let _ = write!(s, "{v}");
            }
        };
        num(&mut s, self.reliability as u64, self.reliability == d.reliability);
        s.push(':');
        num(&mut s, self.durability as u64, self.durability == d.durability);
        s.push(':');
        let (kind, depth) = match self.history {
            History::KeepLast(n) => (1, n),
            History::KeepAll => (2, DEFAULT_DEPTH),
        };
        num(&mut s, kind, kind == 1);
        s.push(',');
        num(&mut s, u64::from(depth), depth == DEFAULT_DEPTH);
        for dur in [self.deadline, self.lifespan] {
            s.push(':');
            duration(&mut s, dur);
        }
        s.push(':');
        num(&mut s, self.liveliness as u64, self.liveliness == d.liveliness);
        s.push(',');
        duration(&mut s, self.lease);
        s
    }

    /// Parses a QoS component (empty fields take rmw_zenoh's defaults).
    pub fn from_keyexpr(s: &str) -> Option<Self> {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() < 6 {
            return None;
        }
        let field =
            |v: &str| -> Option<Option<u64>> { if v.is_empty() { Some(None) } else { v.parse().ok().map(Some) } };
        let pair = |v: &str, n: usize| -> Option<Vec<Option<u64>>> {
            let f: Vec<&str> = v.split(',').collect();
            if f.len() < n {
                return None;
            }
            f.into_iter().take(n).map(field).collect()
        };
        let reliability = match field(parts[0])? {
            None | Some(1) => Reliability::Reliable,
            Some(2) => Reliability::BestEffort,
            _ => return None,
        };
        let durability = match field(parts[1])? {
            None | Some(2) => Durability::Volatile,
            Some(1) => Durability::TransientLocal,
            _ => return None,
        };
        let h = pair(parts[2], 2)?;
        let depth = u32::try_from(h[1].unwrap_or(u64::from(DEFAULT_DEPTH))).ok()?;
        let history = match h[0] {
            None | Some(0) | Some(1) => History::KeepLast(depth),
            Some(2) => History::KeepAll,
            _ => return None,
        };
        let dur = |v: &str| -> Option<Option<Duration>> {
            let p = pair(v, 2)?;
            Some(match (p[0], p[1]) {
                (None, None) => None,
                (s, n) => Some(Duration::new(s.unwrap_or(0), u32::try_from(n.unwrap_or(0)).ok()?)),
            })
        };
        let deadline = dur(parts[3])?;
        let lifespan = dur(parts[4])?;
        let l = pair(parts[5], 3)?;
        let liveliness = match l[0] {
            None | Some(1) => Liveliness::Automatic,
            Some(3) => Liveliness::ManualByTopic,
            _ => return None,
        };
        let lease = match (l[1], l[2]) {
            (None, None) => None,
            (s, n) => Some(Duration::new(s.unwrap_or(0), u32::try_from(n.unwrap_or(0)).ok()?)),
        };
        Some(Self { reliability, durability, history, deadline, lifespan, liveliness, lease })
    }
}

fn duration(s: &mut String, d: Option<Duration>) {
    if let Some(d) = d {
        let _ = write!(s, "{},{}", d.as_secs(), d.subsec_nanos());
    } else {
        s.push(',');
    }
}

/// rmw_zenoh's defaults, field by field in token order: reliability, durability,
/// history, depth, deadline s/ns, lifespan s/ns, liveliness, lease s/ns. Durations
/// default to `RMW_DURATION_INFINITE` (9223372036 s 854775807 ns).
const QOS_DEFAULTS: [u64; 11] =
    [1, 2, 1, 42, 9_223_372_036, 854_775_807, 9_223_372_036, 854_775_807, 1, 9_223_372_036, 854_775_807];
/// The values rmw_zenoh's parser accepts for reliability, durability, history and
/// liveliness (`rmw/types.h`: 0 is "system default"; liveliness also takes 4, "unknown",
/// and 5, "best available"), by field.
const QOS_ENUMS: [(usize, &[u64]); 4] =
    [(0, &[0, 1, 2, 3]), (1, &[0, 1, 2, 3]), (2, &[0, 1, 2, 3]), (8, &[0, 1, 3, 4, 5])];

/// A QoS component as rmw_zenoh rebuilds it after parsing: every field equal to its
/// default written empty, every other one as a plain decimal number. `None` where
/// rmw_zenoh's parser refuses the component.
pub fn canonical_qos(qos: &str) -> Option<String> {
    let parts: Vec<&str> = qos.split(':').collect();
    if parts.len() < 6 {
        return None;
    }
    let mut fields = vec![parts[0], parts[1]];
    for (i, n) in [(2, 2), (3, 2), (4, 2), (5, 3)] {
        let sub: Vec<&str> = parts[i].split(',').collect();
        fields.extend(sub.get(..n)?);
    }
    let mut values = [0u64; 11];
    for (i, f) in fields.iter().enumerate() {
        values[i] = match f {
            &"" => QOS_DEFAULTS[i],
            f if f.bytes().all(|b| b.is_ascii_digit()) => f.parse().ok()?,
            _ => return None,
        };
    }
    for (i, allowed) in QOS_ENUMS {
        // rmw_zenoh looks an enumeration up by its exact text, so "01" is refused.
        if !fields[i].is_empty() && (!allowed.contains(&values[i]) || fields[i] != values[i].to_string()) {
            return None;
        }
    }
    let f: Vec<String> =
        (0..11).map(|i| if values[i] == QOS_DEFAULTS[i] { String::new() } else { values[i].to_string() }).collect();
    Some(format!("{}:{}:{},{}:{},{}:{},{}:{},{},{}", f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10]))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn qos_compact_matches_rmw_zenoh_examples() {
        assert_eq!(Qos::reliable(7).to_keyexpr_compact(), "::,7:,:,:,,");
        assert_eq!(Qos::reliable(10).to_keyexpr_compact(), "::,10:,:,:,,");
        assert_eq!(Qos::sensor_data().to_keyexpr_compact(), "2::,5:,:,:,,");
        assert_eq!(Qos::default().to_keyexpr_compact(), "::,:,:,:,,");
    }

    #[test]
    fn qos_explicit_and_round_trip() {
        assert_eq!(Qos::reliable(10).to_keyexpr(), "1:2:1,10:,:,:1,,");
        assert_eq!(Qos::transient_local(1).to_keyexpr(), "1:1:1,1:,:,:1,,");
        let odd = Qos {
            reliability: Reliability::BestEffort,
            durability: Durability::TransientLocal,
            history: History::KeepAll,
            deadline: Some(Duration::new(5, 0)),
            lifespan: Some(Duration::new(60, 3000)),
            liveliness: Liveliness::ManualByTopic,
            lease: Some(Duration::new(1, 2)),
        };
        assert_eq!(odd.to_keyexpr(), "2:1:2,42:5,0:60,3000:3,1,2");
        for q in [Qos::default(), Qos::reliable(3), Qos::sensor_data(), Qos::transient_local(9), odd] {
            assert_eq!(Qos::from_keyexpr(&q.to_keyexpr()), Some(q), "{}", q.to_keyexpr());
            assert_eq!(Qos::from_keyexpr(&q.to_keyexpr_compact()), Some(q), "{}", q.to_keyexpr_compact());
        }
        for bad in ["", "1:2", "x:2:1,10:,:,:,,", "1:7:1,10:,:,:,,", "1:2:1:,:,:,,", "1:2:1,10:,:,:9,,"] {
            assert_eq!(Qos::from_keyexpr(bad), None, "{bad}");
        }
    }

    #[test]
    fn canonical_qos_is_rmw_zenohs_rebuild() {
        for (given, want) in [
            ("1:2:1,10:,:,:1,,", Some("::,10:,:,:,,")),
            ("::,10:,:,:,,", Some("::,10:,:,:,,")),
            ("2:2:1,5:,:,:1,,", Some("2::,5:,:,:,,")),
            ("1:2:2,10:,:,:1,,", Some("::2,10:,:,:,,")),
            ("1:1:1,042:,:,:1,,", Some(":1:,:,:,:,,")),
            ("0:0:0,0:5,0:9223372036,854775807:3,1,2", Some("0:0:0,0:5,0:,:3,1,2")),
            ("::,:,:,:,,:extra", Some("::,:,:,:,,")),
            ("01:2:1,10:,:,:,,", None),
            ("4:2:1,10:,:,:,,", None),
            ("1:2:1,10:,:,:2,,", None),
            ("1:2:1,x:,:,:,,", None),
            ("1:2:1,-1:,:,:,,", None),
            ("1:2:1,10:,:,:1,", None),
            ("1:2:1:,:,:,,", None),
            ("", None),
        ] {
            assert_eq!(canonical_qos(given).as_deref(), want, "{given}");
        }
    }
}
