//! Swap entries: a device id and a slot offset, packed in a `u64` like the kernel's `swp_entry_t`.

use std::fmt;

/// The id of a swap device (the kernel's swap "type"), below [`DeviceId::MAX_DEVICES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DeviceId(u8);

impl DeviceId {
    /// How many devices a [`SwapEntry`] can name (6 bits of the encoding).
    pub const MAX_DEVICES: usize = 1 << (64 - SwapEntry::OFFSET_BITS);

    /// The id `id`, or `None` if it is not below [`DeviceId::MAX_DEVICES`].
    pub fn new(id: usize) -> Option<Self> {
        if id < Self::MAX_DEVICES {
            u8::try_from(id).ok().map(Self)
        } else {
            None
        }
    }

    /// The id as an index.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One swap slot: the device it is on and its offset there.
///
/// `Copy`, ordered by device then offset, and encodable as a `u64`
/// (device in the top [`64 - OFFSET_BITS`](SwapEntry::OFFSET_BITS) bits, offset below), so a
/// page table, a radix tree or a file can store it as a plain integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SwapEntry {
    device: DeviceId,
    offset: u64,
}

impl SwapEntry {
    /// Bits of the offset in the `u64` encoding.
    pub const OFFSET_BITS: u32 = 58;
    /// The largest offset an entry can hold.
    pub const MAX_OFFSET: u64 = (1 << Self::OFFSET_BITS) - 1;

    /// The entry for slot `offset` of `device`, or `None` if the offset does not fit in
    /// [`SwapEntry::OFFSET_BITS`] bits.
    pub fn new(device: DeviceId, offset: u64) -> Option<Self> {
        (offset <= Self::MAX_OFFSET).then_some(Self { device, offset })
    }

    /// Internal constructor for offsets known to fit (below a device's slot count).
    pub(crate) fn from_parts(device: DeviceId, offset: u64) -> Self {
        debug_assert!(offset <= Self::MAX_OFFSET);
        Self { device, offset }
    }

    /// The device the slot is on.
    pub fn device(self) -> DeviceId {
        self.device
    }

    /// The slot's offset on its device.
    pub fn offset(self) -> u64 {
        self.offset
    }

    /// The `u64` encoding: `device << OFFSET_BITS | offset`.
    pub fn to_u64(self) -> u64 {
        (u64::from(self.device.0) << Self::OFFSET_BITS) | self.offset
    }

    /// Decodes [`SwapEntry::to_u64`]. Every `u64` decodes to some entry; whether the entry
    /// names a slot of a real device is checked when it is used.
    pub fn from_u64(raw: u64) -> Self {
        // The shift leaves 6 bits, which always fit in a u8 below MAX_DEVICES.
        let device = DeviceId((raw >> Self::OFFSET_BITS) as u8);
        Self {
            device,
            offset: raw & Self::MAX_OFFSET,
        }
    }

    /// The entry `n` slots further on the same device (saturating at the largest offset).
    pub fn plus(self, n: u64) -> Self {
        Self {
            device: self.device,
            offset: self.offset.saturating_add(n).min(Self::MAX_OFFSET),
        }
    }
}

impl fmt::Display for SwapEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "swap {}:{:#x}", self.device, self.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u64_round_trip() {
        for (d, o) in [
            (0usize, 0u64),
            (1, 7),
            (63, SwapEntry::MAX_OFFSET),
            (5, 1 << 40),
        ] {
            let e = SwapEntry::new(DeviceId::new(d).unwrap(), o).unwrap();
            assert_eq!(SwapEntry::from_u64(e.to_u64()), e);
        }
        assert!(DeviceId::new(64).is_none());
        assert!(SwapEntry::new(DeviceId::default(), SwapEntry::MAX_OFFSET + 1).is_none());
        assert_eq!(format!("{}", SwapEntry::from_u64(0x10)), "swap 0:0x10");
    }
}
