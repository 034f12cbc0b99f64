//! Property tests for `TensorMeta::validate`: it must accept exactly the views whose every
//! element lies inside the payload, judged by two references written independently of the
//! crate: an `i128` evaluation of the rules, and (for small tensors) a brute-force walk
//! over every element.

use proptest::prelude::*;
use tensor_codec::{DType, Device, DeviceType, MetaError, TensorMeta, contiguous_strides};

/// The first rule a meta breaks, as the variant name, or the accepted `(numel, end)`.
type Verdict = Result<(u64, u64), &'static str>;

fn variant(e: &MetaError) -> &'static str {
    match e {
        MetaError::UnsupportedDType { .. } => "UnsupportedDType",
        MetaError::RankTooLarge { .. } => "RankTooLarge",
        MetaError::InvalidShape { .. } => "InvalidShape",
        MetaError::StridesLenMismatch { .. } => "StridesLenMismatch",
        MetaError::NegativeStride { .. } => "NegativeStride",
        MetaError::NonCompactSubByte { .. } => "NonCompactSubByte",
        MetaError::MisalignedOffset { .. } => "MisalignedOffset",
        // Overflow is reported where the needed size exceeds 64 bits: out of bounds.
        MetaError::SpanOutOfBounds { .. } | MetaError::Overflow { step: _ } => "OutOfBounds",
        MetaError::UnknownDeviceType { .. } => "UnknownDeviceType",
        MetaError::InvalidDeviceId { .. } => "InvalidDeviceId",
        _ => "other",
    }
}

/// `byte_offset + size` of the view in exact (`i128`, `None` = beyond any `u64`)
/// arithmetic, after the structural rules; `Err` names the first structural rule broken.
fn reference_end(m: &TensorMeta) -> Result<(u64, Option<i128>), &'static str> {
    if m.device.device_id < 0 {
        return Err("InvalidDeviceId");
    }
    if m.shape.len() > 64 {
        return Err("RankTooLarge");
    }
    if m.shape.iter().any(|&d| d < 0) {
        return Err("InvalidShape");
    }
    if !m.strides.is_empty() && m.strides.len() != m.shape.len() {
        return Err("StridesLenMismatch");
    }
    if m.strides.iter().any(|&s| s < 0) {
        return Err("NegativeStride");
    }
    let item_bits = i128::from(m.dtype.bits()) * i128::from(m.dtype.lanes());
    let byte_sized = item_bits % 8 == 0;
    if byte_sized && i128::from(m.byte_offset) % (item_bits / 8) != 0 {
        return Err("MisalignedOffset");
    }
    // numel, exact; it must fit in i64.
    let mut numel: Option<i128> = Some(1);
    for &d in &m.shape {
        numel = numel.and_then(|n| n.checked_mul(i128::from(d)));
    }
    if m.shape.contains(&0) {
        numel = Some(0);
    }
    let numel = match numel {
        Some(n) if n <= i128::from(i64::MAX) => n,
        _ => return Err("OutOfBounds"),
    };
    let offset = i128::from(m.byte_offset);
    if numel == 0 {
        return Ok((0, Some(offset)));
    }
    if !byte_sized && !m.strides.is_empty() {
        // Compact: each dimension of size > 1 has stride = product of the later sizes.
        for dim in 0..m.shape.len() {
            let later: i128 = m.shape[dim + 1..].iter().map(|&d| i128::from(d)).product();
            if m.shape[dim] != 1 && i128::from(m.strides[dim]) != later {
                return Err("NonCompactSubByte");
            }
        }
    }
    let size = if !byte_sized || m.strides.is_empty() {
        Some((numel * item_bits + 7) / 8)
    } else {
        let mut last: Option<i128> = Some(0);
        for (&d, &s) in m.shape.iter().zip(&m.strides) {
            last = last.and_then(|acc| (i128::from(d) - 1).checked_mul(i128::from(s)).and_then(|t| acc.checked_add(t)));
        }
        last.and_then(|l| (l + 1).checked_mul(item_bits / 8))
    };
    Ok((numel.unsigned_abs() as u64, size.and_then(|s| s.checked_add(offset))))
}

fn reference(m: &TensorMeta, payload_len: u64) -> Verdict {
    let (numel, end) = reference_end(m)?;
    match end {
        Some(end) if end <= i128::from(payload_len) => Ok((numel, end as u64)),
        _ => Err("OutOfBounds"),
    }
}

/// Brute force for small tensors: the end of the last byte any element touches, in
/// exact arithmetic. `None` when the tensor is too large to walk.
fn brute_force_end(m: &TensorMeta) -> Option<i128> {
    let numel = m.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(u64::try_from(d).ok()?))?;
    if numel > 4096 {
        return None;
    }
    let offset = i128::from(m.byte_offset);
    if numel == 0 {
        return Some(offset);
    }
    let item_bits = i128::from(m.dtype.bits()) * i128::from(m.dtype.lanes());
    if item_bits % 8 != 0 {
        // Packed: element i occupies bits [i*b, (i+1)*b) after byte_offset.
        return Some(offset + (i128::from(numel) * item_bits + 7) / 8);
    }
    let strides: Vec<i64> = if m.strides.is_empty() {
        // Row-major, computed here rather than with the crate's helper.
        (0..m.shape.len()).map(|dim| m.shape[dim + 1..].iter().product()).collect()
    } else {
        m.strides.clone()
    };
    let itemsize = item_bits / 8;
    let mut end = 0i128;
    let mut index = vec![0i64; m.shape.len()];
    for _ in 0..numel {
        let elem: i128 = index.iter().zip(&strides).map(|(&i, &s)| i128::from(i) * i128::from(s)).sum();
        end = end.max(offset + (elem + 1) * itemsize);
        // Odometer increment.
        for dim in (0..index.len()).rev() {
            index[dim] += 1;
            if index[dim] < m.shape[dim] {
                break;
            }
            index[dim] = 0;
        }
    }
    Some(end)
}

fn dim() -> impl Strategy<Value = i64> {
    prop_oneof![
        30 => 0i64..=5,
        3 => Just(1i64 << 31),
        3 => Just(1i64 << 62),
        2 => Just(i64::MAX),
        1 => -3i64..0,
    ]
}

fn stride() -> impl Strategy<Value = i64> {
    prop_oneof![
        30 => 0i64..=12,
        3 => Just(1i64 << 32),
        2 => Just(i64::MAX),
        1 => -2i64..0,
    ]
}

fn dtype() -> impl Strategy<Value = DType> {
    proptest::sample::select(DType::ALL)
}

/// A meta whose strides are empty, row-major, random, or (rarely) of the wrong length.
fn meta() -> impl Strategy<Value = TensorMeta> {
    (
        dtype(),
        prop::collection::vec(dim(), 0..=5),
        0u8..10,
        any::<u64>(),
        0u8..10,
        prop_oneof![30 => 0i32..4, 1 => Just(-1i32)],
    )
        .prop_flat_map(|(dtype, shape, mode, seed, offset_mode, device_id)| {
            let rank = shape.len();
            let strides: BoxedStrategy<Vec<i64>> = match mode {
                0..=2 => Just(Vec::new()).boxed(),
                3 | 4 => Just(contiguous_strides(&shape).unwrap_or_default()).boxed(),
                5..=8 => prop::collection::vec(stride(), rank).boxed(),
                _ => prop::collection::vec(stride(), 0..=6).boxed(),
            };
            let itemsize = dtype.itemsize().unwrap_or(1);
            let offset: BoxedStrategy<u64> = match offset_mode {
                0..=3 => Just(0u64).boxed(),
                4..=6 => (0u64..16).prop_map(move |k| k * itemsize).boxed(),
                7 | 8 => (0u64..64).boxed(),
                _ => Just(u64::MAX - (seed % 64)).boxed(),
            };
            (Just(dtype), Just(shape), strides, offset, Just(device_id))
        })
        .prop_map(|(dtype, shape, strides, byte_offset, device_id)| TensorMeta {
            dtype,
            shape,
            strides,
            byte_offset,
            device: Device::new(DeviceType::Cuda, device_id),
        })
}

/// A payload length near the view's true end (to hit the boundary), or anywhere.
fn payload_len_for(m: &TensorMeta, mode: u8, delta: i64, random: u64) -> u64 {
    let end = match reference_end(m) {
        Ok((_, Some(end))) => end,
        _ => i128::from(random % 4096),
    };
    match mode {
        0..=5 => (end + i128::from(delta)).clamp(0, i128::from(u64::MAX)) as u64,
        6 => u64::MAX,
        _ => random % 4096,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8192, ..ProptestConfig::default() })]

    #[test]
    fn accepts_exactly_in_bounds_views(
        m in meta(),
        mode in 0u8..8,
        delta in -3i64..=3,
        random in any::<u64>(),
    ) {
        let payload_len = payload_len_for(&m, mode, delta, random);
        let got = m.validate(payload_len);
        let want = reference(&m, payload_len);
        match (&got, &want) {
            (Ok(extent), Ok((numel, end))) => {
                prop_assert_eq!(extent.numel, *numel);
                prop_assert_eq!(extent.end, *end);
                prop_assert_eq!(extent.end, m.byte_offset + extent.bytes);
                prop_assert!(extent.end <= payload_len);
            }
            (Err(e), Err(reason)) => prop_assert_eq!(variant(e), *reason, "{:?}", e),
            _ => prop_assert!(false, "validate {:?} but reference {:?} for {:?} len {}", got, want, m, payload_len),
        }
        // Independent brute force over every element, for small tensors.
        if let (Ok((_, ref_end)), Some(bf_end)) = (reference_end(&m), brute_force_end(&m)) {
            prop_assert_eq!(ref_end, Some(bf_end));
            prop_assert_eq!(got.is_ok(), bf_end <= i128::from(payload_len));
        }
    }

    #[test]
    fn encode_agrees_with_validate(m in meta(), len in 0u64..2048) {
        match (m.validate(len), m.encode(len)) {
            (Ok(_), Ok(bytes)) => prop_assert_eq!(TensorMeta::decode(&bytes, len), Ok(m)),
            (Err(e), Err(tensor_codec::EncodeError::Invalid(e2))) => prop_assert_eq!(e, e2),
            (v, e) => prop_assert!(false, "validate {:?} but encode {:?}", v, e),
        }
    }

    #[test]
    fn contiguous_strides_match_definition(shape in prop::collection::vec(0i64..=7, 0..=6)) {
        let strides = contiguous_strides(&shape).unwrap();
        for dim in 0..shape.len() {
            let later: i64 = shape[dim + 1..].iter().map(|&d| d.max(1)).product();
            prop_assert_eq!(strides[dim], later);
        }
        let m = TensorMeta::contiguous(DType::U8, shape, Device::CPU).with_strides(strides);
        prop_assert!(m.is_contiguous());
    }
}
