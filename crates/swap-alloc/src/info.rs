//! Several devices with priorities (the kernel's `swap_info[]` and `swap_avail_heads`).

use std::sync::atomic::{AtomicU64 as StatU64, AtomicUsize, Ordering};

use crate::cluster::NR_ORDERS;
use crate::device::{DeviceConfig, SlotState, SlotUsage, SwapDevice};
use crate::entry::{DeviceId, SwapEntry};
use crate::error::SwapError;
use crate::stats::DeviceStats;
use std::sync::Arc;

use crate::sync::RwLock;

#[derive(Debug)]
struct Slot {
    dev: Arc<SwapDevice>,
    priority: i32,
}

#[derive(Debug)]
struct PrioGroup {
    priority: i32,
    members: Vec<DeviceId>,
    /// Round-robin position among the devices of equal priority.
    rotor: AtomicUsize,
}

#[derive(Debug, Default)]
struct Inner {
    slots: Vec<Option<Slot>>,
    /// By priority, highest first.
    groups: Vec<PrioGroup>,
}

impl Inner {
    fn rebuild_groups(&mut self) {
        let mut groups: Vec<PrioGroup> = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            let Some(s) = s else { continue };
            let Some(id) = DeviceId::new(i) else { continue };
            match groups.iter_mut().find(|g| g.priority == s.priority) {
                Some(g) => g.members.push(id),
                None => groups.push(PrioGroup {
                    priority: s.priority,
                    members: vec![id],
                    rotor: AtomicUsize::new(0),
                }),
            }
        }
        groups.sort_by_key(|g| std::cmp::Reverse(g.priority));
        self.groups = groups;
    }

    fn device(&self, entry: SwapEntry) -> Result<&SwapDevice, SwapError> {
        match self.slots.get(entry.device().index()) {
            Some(Some(s)) => Ok(&s.dev),
            _ => Err(SwapError::WrongDevice {
                entry,
                expected: "a swapped-on device",
            }),
        }
    }
}

/// The swap devices of one user, by priority: allocation goes round-robin among the devices
/// of the highest priority that has room and spills to the next priority when they are full;
/// entry operations go to the device the entry names.
///
/// Device add and remove (`swapon`, `swapoff`) take a write lock; every other call takes it
/// for reading, so a device cannot disappear under a call that uses it.
#[derive(Debug)]
pub struct SwapInfo {
    inner: RwLock<Inner>,
    fallback: [StatU64; NR_ORDERS],
}

impl Default for SwapInfo {
    fn default() -> Self {
        Self::new()
    }
}

impl SwapInfo {
    /// No devices.
    pub fn new() -> Self {
        Self {
            inner: RwLock::new(Inner::default()),
            fallback: std::array::from_fn(|_| StatU64::new(0)),
        }
    }

    /// Adds a device at `priority` (higher is used first) and returns its id, the lowest
    /// free one.
    pub fn swapon(&self, config: DeviceConfig, priority: i32) -> Result<DeviceId, SwapError> {
        let mut inner = self.inner.write();
        let free = inner.slots.iter().position(Option::is_none);
        let index = free.unwrap_or(inner.slots.len());
        let id = DeviceId::new(index).ok_or(SwapError::TooManyDevices {
            max: DeviceId::MAX_DEVICES,
        })?;
        let dev = Arc::new(SwapDevice::with_id(id, config)?);
        if index == inner.slots.len() {
            inner.slots.push(None);
        }
        inner.slots[index] = Some(Slot { dev, priority });
        inner.rebuild_groups();
        Ok(id)
    }

    /// Stops (or resumes) allocation from a device, so that its users can move their slots
    /// off it before [`swapoff`](Self::swapoff) (the kernel's swapoff first takes the device
    /// off the available list, then unuses its slots).
    pub fn set_allocatable(&self, device: DeviceId, yes: bool) -> Result<(), SwapError> {
        let inner = self.inner.read();
        match inner.slots.get(device.index()) {
            Some(Some(s)) => {
                s.dev.allocatable.store(yes, Ordering::Relaxed);
                Ok(())
            }
            _ => Err(SwapError::NoDevice { device }),
        }
    }

    /// Removes a device. Refuses with [`SwapError::DeviceBusy`] while any slot on it is in
    /// use (the caller drains it first, see [`set_allocatable`](Self::set_allocatable)).
    /// Returns the device.
    pub fn swapoff(&self, device: DeviceId) -> Result<Arc<SwapDevice>, SwapError> {
        let mut inner = self.inner.write();
        let in_use = match inner.slots.get(device.index()) {
            Some(Some(s)) => s.dev.in_use(),
            _ => return Err(SwapError::NoDevice { device }),
        };
        if in_use > 0 {
            return Err(SwapError::DeviceBusy { device, in_use });
        }
        let slot = inner.slots[device.index()]
            .take()
            .ok_or(SwapError::NoDevice { device })?;
        inner.rebuild_groups();
        Ok(slot.dev)
    }

    /// The device with this id.
    pub fn device(&self, device: DeviceId) -> Option<Arc<SwapDevice>> {
        let inner = self.inner.read();
        inner
            .slots
            .get(device.index())
            .and_then(|s| s.as_ref().map(|s| Arc::clone(&s.dev)))
    }

    /// The ids and priorities of the devices, highest priority first.
    pub fn devices(&self) -> Vec<(DeviceId, i32)> {
        let inner = self.inner.read();
        inner
            .groups
            .iter()
            .flat_map(|g| g.members.iter().map(move |&id| (id, g.priority)))
            .collect()
    }

    /// Allocates `2^order` slots, each with one reference (see [`SwapDevice::alloc`]).
    pub fn alloc(&self, order: u32) -> Result<SwapEntry, SwapError> {
        self.alloc_with(order, SlotUsage::Referenced)
    }

    /// Allocates `2^order` slots marked as `usage` says, from the highest priority with room,
    /// round-robin among equals.
    pub fn alloc_with(&self, order: u32, usage: SlotUsage) -> Result<SwapEntry, SwapError> {
        let inner = self.inner.read();
        let mut max_order = None;
        for g in &inner.groups {
            let n = g.members.len();
            let start = g.rotor.fetch_add(1, Ordering::Relaxed);
            for k in 0..n {
                let id = g.members[(start + k) % n];
                let Some(Some(slot)) = inner.slots.get(id.index()) else {
                    continue;
                };
                let dev = &slot.dev;
                max_order = max_order.max(Some(dev.max_order()));
                if order > dev.max_order() || !dev.allocatable.load(Ordering::Relaxed) {
                    continue;
                }
                if let Some(e) = dev.try_alloc(order, usage) {
                    return Ok(e);
                }
            }
        }
        match max_order {
            Some(max) if order > max => Err(SwapError::OrderTooLarge { order, max }),
            None if order as usize >= NR_ORDERS => Err(SwapError::OrderTooLarge {
                order,
                max: NR_ORDERS as u32 - 1,
            }),
            _ => {
                if let Some(c) = self.fallback.get(order as usize) {
                    c.fetch_add(1, Ordering::Relaxed);
                }
                Err(SwapError::NoSpace { order })
            }
        }
    }

    /// See [`SwapDevice::dup`].
    pub fn dup(&self, entry: SwapEntry) -> Result<u16, SwapError> {
        self.inner.read().device(entry)?.dup(entry)
    }

    /// See [`SwapDevice::put`].
    pub fn put(&self, entry: SwapEntry) -> Result<bool, SwapError> {
        self.inner.read().device(entry)?.put(entry)
    }

    /// See [`SwapDevice::put_range`].
    pub fn put_range(&self, entry: SwapEntry, order: u32) -> Result<usize, SwapError> {
        self.inner.read().device(entry)?.put_range(entry, order)
    }

    /// Drops one reference from each entry; entries may be on different devices. On a bad
    /// entry returns [`SwapError::InBatch`]: those before it were processed, the rest not.
    pub fn put_batch(&self, entries: &[SwapEntry]) -> Result<usize, SwapError> {
        let inner = self.inner.read();
        let mut freed = 0;
        let mut start = 0;
        while start < entries.len() {
            let dev_id = entries[start].device();
            let end = entries[start..]
                .iter()
                .position(|e| e.device() != dev_id)
                .map_or(entries.len(), |p| start + p);
            let run = &entries[start..end];
            let result = inner
                .device(run[0])
                .and_then(|dev| dev.put_batch(run))
                .map_err(|e| match e {
                    SwapError::InBatch { index, source } => SwapError::InBatch {
                        index: start + index,
                        source,
                    },
                    other => SwapError::InBatch {
                        index: start,
                        source: Box::new(other),
                    },
                })?;
            freed += result;
            start = end;
        }
        Ok(freed)
    }

    /// See [`SwapDevice::swapcache_prepare`].
    pub fn swapcache_prepare(&self, entry: SwapEntry) -> Result<(), SwapError> {
        self.inner.read().device(entry)?.swapcache_prepare(entry)
    }

    /// See [`SwapDevice::swapcache_clear`].
    pub fn swapcache_clear(&self, entry: SwapEntry) -> Result<bool, SwapError> {
        self.inner.read().device(entry)?.swapcache_clear(entry)
    }

    /// See [`SwapDevice::slot`].
    pub fn slot(&self, entry: SwapEntry) -> Result<SlotState, SwapError> {
        self.inner.read().device(entry)?.slot(entry)
    }

    /// Counters of all devices added together; `swpout_fallback` counts requests that no
    /// device could serve.
    pub fn stats(&self) -> DeviceStats {
        let inner = self.inner.read();
        let mut total = DeviceStats::default();
        for s in inner.slots.iter().flatten() {
            let mut d = s.dev.stats();
            d.swpout_fallback = [0; NR_ORDERS];
            total.add(&d);
        }
        for (t, c) in total.swpout_fallback.iter_mut().zip(&self.fallback) {
            *t = c.load(Ordering::Relaxed);
        }
        total
    }

    /// [`SwapDevice::check_integrity`] on every device.
    pub fn check_integrity(&self) -> Result<(), SwapError> {
        let inner = self.inner.read();
        for s in inner.slots.iter().flatten() {
            s.dev.check_integrity()?;
        }
        Ok(())
    }
}
