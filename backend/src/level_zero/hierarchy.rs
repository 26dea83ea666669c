//! Which Level Zero device rserve runs on: the rules of `ZE_FLAT_DEVICE_HIERARCHY` and `ZE_AFFINITY_MASK` as pure
//! functions over plain numbers, so they are tested without a driver.
//!
//! The Intel driver applies both variables itself: `zeDeviceGet` already returns only the devices the mask selects,
//! renumbered from 0, in the hierarchy's shape (FLAT and COMBINED: every tile of a multi-tile card is a root device;
//! COMPOSITE: a card is one root device and its tiles are sub-devices). rserve therefore
//! - indexes the devices it can run on (`candidates`): FLAT/COMBINED want one tile per device, so a root device that
//!   still has sub-devices (a driver older than the variable, which always answers COMPOSITE) is split into its
//!   tiles here; COMPOSITE keeps whole cards (the driver spreads work over their tiles, "implicit scaling");
//! - parses the mask to warn when it cannot mean what the user wants (card.tile entries under FLAT) or when the
//!   driver visibly ignored it (more devices than the mask can select);
//! - computes the mask that pins a process to one tile (`pin_mask`), the building block of one-process-per-tile runs.

use std::fmt;

use super::error::LzError;

/// `ZE_FLAT_DEVICE_HIERARCHY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hierarchy {
    /// Every tile is a root device (the driver's default on Data Center GPU Max since 2023).
    Flat,
    /// A card is a root device; its tiles are sub-devices.
    Composite,
    /// Tiles are root devices, and the card can still be reached as their composite device.
    Combined,
}

impl Hierarchy {
    /// Parses the variable's value (case-insensitive); unset or empty means FLAT, the driver default.
    pub fn parse(value: Option<&str>) -> Result<Self, LzError> {
        match value.map(str::trim).map(str::to_ascii_uppercase).as_deref() {
            None | Some("") | Some("FLAT") => Ok(Hierarchy::Flat),
            Some("COMPOSITE") => Ok(Hierarchy::Composite),
            Some("COMBINED") => Ok(Hierarchy::Combined),
            Some(_) => Err(LzError::Selection(format!(
                "ZE_FLAT_DEVICE_HIERARCHY={} is not one of FLAT, COMPOSITE, COMBINED",
                value.unwrap_or_default()
            ))),
        }
    }

    /// Whether every tile is its own root device.
    pub fn tiles_are_devices(self) -> bool {
        matches!(self, Hierarchy::Flat | Hierarchy::Combined)
    }
}

impl fmt::Display for Hierarchy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Hierarchy::Flat => "FLAT",
            Hierarchy::Composite => "COMPOSITE",
            Hierarchy::Combined => "COMBINED",
        })
    }
}

/// One entry of `ZE_AFFINITY_MASK`: a device index, or `device.sub_device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct MaskEntry {
    pub device: u32,
    pub sub_device: Option<u32>,
}

/// A parsed `ZE_AFFINITY_MASK`: entries sorted, duplicates removed (the driver ignores order and repeats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffinityMask {
    pub entries: Vec<MaskEntry>,
}

impl AffinityMask {
    /// Parses a comma-separated list of `N` or `N.M` (spaces allowed). None when the value is empty.
    pub fn parse(value: &str) -> Result<Option<Self>, LzError> {
        let value = value.trim();
        if value.is_empty() {
            return Ok(None);
        }
        let bad = |item: &str| {
            LzError::Selection(format!(
                "ZE_AFFINITY_MASK={value}: '{item}' is not a device index (N) or device.sub-device (N.M)"
            ))
        };
        let num = |s: &str, item: &str| s.trim().parse::<u32>().map_err(|_| bad(item));
        let mut entries = Vec::new();
        for item in value.split(',') {
            let entry = match item.split_once('.') {
                None => MaskEntry { device: num(item, item)?, sub_device: None },
                Some((d, s)) => MaskEntry { device: num(d, item)?, sub_device: Some(num(s, item)?) },
            };
            entries.push(entry);
        }
        entries.sort();
        entries.dedup();
        Ok(Some(Self { entries }))
    }

    /// The most root devices a driver can expose under this mask (one per distinct device index).
    pub fn max_devices(&self) -> usize {
        let mut devices: Vec<u32> = self.entries.iter().map(|e| e.device).collect();
        devices.dedup();
        devices.len()
    }

    /// A warning when the mask's notation does not fit the hierarchy: under FLAT/COMBINED each tile is already a
    /// device with no sub-devices, so `card.tile` entries select nothing.
    pub fn notation_warning(&self, h: Hierarchy) -> Option<String> {
        let dotted: Vec<String> =
            self.entries.iter().filter_map(|e| e.sub_device.map(|s| format!("{}.{s}", e.device))).collect();
        if h.tiles_are_devices() && !dotted.is_empty() {
            Some(format!(
                "ZE_AFFINITY_MASK has device.sub-device entries ({}) but ZE_FLAT_DEVICE_HIERARCHY is {h}: in {h} mode \
                 every tile is a device, so the mask lists tile indices (card c, tile t of a 2-tile card is 2c+t); \
                 or set ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE",
                dotted.join(",")
            ))
        } else {
            None
        }
    }
}

/// A device rserve can run on: root device `root` of the driver's list, or its sub-device `sub`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub root: usize,
    pub sub: Option<u32>,
}

/// The devices `--device level-zero:N` indexes, given how many sub-devices each root device of the driver's list has.
pub fn candidates(sub_devices: &[u32], h: Hierarchy) -> Vec<Candidate> {
    let mut out = Vec::new();
    for (root, &n) in sub_devices.iter().enumerate() {
        if h.tiles_are_devices() && n > 0 {
            out.extend((0..n).map(|s| Candidate { root, sub: Some(s) }));
        } else {
            out.push(Candidate { root, sub: None });
        }
    }
    out
}

/// Candidate `index` (default 0), or an error that says how many there are.
pub fn pick(cands: &[Candidate], index: Option<usize>, h: Hierarchy) -> Result<Candidate, LzError> {
    let i = index.unwrap_or(0);
    cands.get(i).copied().ok_or_else(|| {
        LzError::Selection(format!(
            "--device level-zero:{i} does not exist: {} Level Zero device(s) visible under ZE_FLAT_DEVICE_HIERARCHY={h}",
            cands.len()
        ))
    })
}

/// What a driver following the Level Zero rules exposes on a node whose cards have `tiles[c]` tiles: the root
/// devices in order, each as the (card, tile) pairs it spans. Used to check masks and to explain them.
pub fn exposed(tiles: &[u32], h: Hierarchy, mask: Option<&AffinityMask>) -> Vec<Vec<(u32, u32)>> {
    // The hierarchy's root devices before masking, each with its sub-devices (as (card, tile) pairs).
    let roots: Vec<Vec<(u32, u32)>> = if h.tiles_are_devices() {
        tiles.iter().enumerate().flat_map(|(c, &n)| (0..n.max(1)).map(move |t| vec![(c as u32, t)])).collect()
    } else {
        tiles.iter().enumerate().map(|(c, &n)| (0..n.max(1)).map(|t| (c as u32, t)).collect()).collect()
    };
    let Some(mask) = mask else { return roots };
    let mut out = Vec::new();
    for (d, parts) in roots.iter().enumerate() {
        let d = d as u32;
        if mask.entries.iter().any(|e| e.device == d && e.sub_device.is_none()) {
            out.push(parts.clone());
            continue;
        }
        // Sub-device entries: only a root device with sub-devices (more than one part) has any.
        let subs: Vec<(u32, u32)> = if parts.len() > 1 {
            mask.entries
                .iter()
                .filter(|e| e.device == d)
                .filter_map(|e| e.sub_device.and_then(|s| parts.get(s as usize).copied()))
                .collect()
        } else {
            Vec::new()
        };
        if !subs.is_empty() {
            out.push(subs);
        }
    }
    out
}

/// The `ZE_AFFINITY_MASK` value that shows a process exactly tile `tile` of card `card` (cards of `tiles_per_card`
/// tiles): the flat index under FLAT/COMBINED, `card.tile` under COMPOSITE.
pub fn pin_mask(h: Hierarchy, card: u32, tile: u32, tiles_per_card: u32) -> String {
    if h.tiles_are_devices() {
        (card * tiles_per_card.max(1) + tile).to_string()
    } else if tiles_per_card > 1 {
        format!("{card}.{tile}")
    } else {
        card.to_string()
    }
}
