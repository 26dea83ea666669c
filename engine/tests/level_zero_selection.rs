//! Device selection under ZE_FLAT_DEVICE_HIERARCHY and ZE_AFFINITY_MASK: the pure rules (which devices rserve can
//! run on, what a mask selects on an Aurora-like node of 6 two-tile cards, the mask that pins one tile), and their
//! wiring on the null driver (a bad hierarchy value and an index past the visible devices are one-line errors).

mod level_zero_support;

use level_zero_support as lz;
use rserve_engine::backend::level_zero::hierarchy::*;
use rserve_engine::engine::device::Device;

fn mask(s: &str) -> AffinityMask {
    AffinityMask::parse(s).unwrap().unwrap()
}

#[test]
fn hierarchy_values() {
    assert_eq!(Hierarchy::parse(None).unwrap(), Hierarchy::Flat);
    assert_eq!(Hierarchy::parse(Some("")).unwrap(), Hierarchy::Flat);
    assert_eq!(Hierarchy::parse(Some("composite")).unwrap(), Hierarchy::Composite);
    assert_eq!(Hierarchy::parse(Some(" COMBINED ")).unwrap(), Hierarchy::Combined);
    let e = Hierarchy::parse(Some("TILES")).unwrap_err().to_string();
    assert!(e.contains("ZE_FLAT_DEVICE_HIERARCHY=TILES") && e.contains("FLAT, COMPOSITE, COMBINED"), "{e}");
}

#[test]
fn mask_parsing() {
    assert_eq!(AffinityMask::parse("").unwrap(), None);
    assert_eq!(AffinityMask::parse("  ").unwrap(), None);
    let m = mask("3, 1.1,1.0,3");
    assert_eq!(
        m.entries,
        vec![
            MaskEntry { device: 1, sub_device: Some(0) },
            MaskEntry { device: 1, sub_device: Some(1) },
            MaskEntry { device: 3, sub_device: None },
        ]
    );
    assert_eq!(m.max_devices(), 2);
    for bad in ["a", "1,,2", "1.x", "-1", "1.2.3"] {
        let e = AffinityMask::parse(bad).unwrap_err().to_string();
        assert!(e.starts_with(&format!("ZE_AFFINITY_MASK={bad}:")), "{bad}: {e}");
    }
}

#[test]
fn flat_splits_cards_into_tiles_composite_keeps_cards() {
    // Two 2-tile cards as a driver in COMPOSITE shape lists them, and a 1-tile card.
    let tree = [2, 2, 0];
    let flat = candidates(&tree, Hierarchy::Flat);
    assert_eq!(flat.len(), 5);
    assert_eq!(flat[0], Candidate { root: 0, sub: Some(0) });
    assert_eq!(flat[3], Candidate { root: 1, sub: Some(1) });
    assert_eq!(flat[4], Candidate { root: 2, sub: None });
    assert_eq!(candidates(&tree, Hierarchy::Combined), flat);
    let comp = candidates(&tree, Hierarchy::Composite);
    assert_eq!(comp, (0..3).map(|root| Candidate { root, sub: None }).collect::<Vec<_>>());
    // A driver that already flattened lists tiles without sub-devices: one candidate each.
    assert_eq!(candidates(&[0; 12], Hierarchy::Flat).len(), 12);
}

#[test]
fn picking_an_index() {
    let c = candidates(&[0, 0], Hierarchy::Flat);
    assert_eq!(pick(&c, None, Hierarchy::Flat).unwrap().root, 0);
    assert_eq!(pick(&c, Some(1), Hierarchy::Flat).unwrap().root, 1);
    let e = pick(&c, Some(2), Hierarchy::Flat).unwrap_err().to_string();
    assert!(e.contains("level-zero:2") && e.contains("2 Level Zero device(s)") && e.contains("FLAT"), "{e}");
    assert!(pick(&[], None, Hierarchy::Composite).is_err());
}

#[test]
fn what_a_driver_exposes_on_an_aurora_node() {
    let node = [2u32; 6];
    assert_eq!(exposed(&node, Hierarchy::Flat, None).len(), 12);
    assert_eq!(exposed(&node, Hierarchy::Composite, None).len(), 6);
    // FLAT: flat indices; 5 is card 2 tile 1; devices come out in index order.
    assert_eq!(exposed(&node, Hierarchy::Flat, Some(&mask("5,0"))), vec![vec![(0, 0)], vec![(2, 1)]]);
    // FLAT: card.tile entries select nothing (flat devices have no sub-devices).
    assert!(exposed(&node, Hierarchy::Flat, Some(&mask("0.1"))).is_empty());
    // COMPOSITE: a card entry keeps both tiles; card.tile keeps one.
    assert_eq!(exposed(&node, Hierarchy::Composite, Some(&mask("1"))), vec![vec![(1, 0), (1, 1)]]);
    assert_eq!(exposed(&node, Hierarchy::Composite, Some(&mask("1.1,4.0"))), vec![vec![(1, 1)], vec![(4, 0)]]);
    // Entries beyond the node are ignored.
    assert_eq!(exposed(&node, Hierarchy::Flat, Some(&mask("11,12"))), vec![vec![(5, 1)]]);
}

#[test]
fn pin_mask_shows_exactly_one_tile() {
    let node = [2u32; 6];
    for h in [Hierarchy::Flat, Hierarchy::Composite, Hierarchy::Combined] {
        for card in 0..6 {
            for tile in 0..2 {
                let m = mask(&pin_mask(h, card, tile, 2));
                assert_eq!(exposed(&node, h, Some(&m)), vec![vec![(card, tile)]], "{h} card {card} tile {tile}");
                assert_eq!(m.max_devices(), 1);
            }
        }
    }
}

#[test]
fn card_tile_masks_under_flat_are_flagged() {
    let w = mask("0.1").notation_warning(Hierarchy::Flat).unwrap();
    assert!(w.contains("0.1") && w.contains("FLAT"), "{w}");
    assert!(mask("0.1").notation_warning(Hierarchy::Composite).is_none());
    assert!(mask("3").notation_warning(Hierarchy::Flat).is_none());
}

fn select_in_child() {
    let arg = std::env::var("LZ_TEST_DEVICE").unwrap();
    match Device::select(&arg) {
        Ok(d) => println!("LZ-FOUND: {}", d.name()),
        Err(e) => println!("LZ-ERROR: {e}"),
    }
}

fn select_on_null_driver(test: &str, device: &str, extra: &[(&str, &str)]) -> String {
    let mut env = lz::null_driver_env();
    env.push(("LZ_TEST_DEVICE".into(), device.into()));
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let out = lz::run_child(test, &env);
    let text = lz::text(&out);
    assert!(out.status.success(), "the child failed:\n{text}");
    text
}

#[test]
fn null_driver_device_zero_is_found_and_one_is_not() {
    if lz::in_child() {
        return select_in_child();
    }
    let t = "null_driver_device_zero_is_found_and_one_is_not";
    let found = select_on_null_driver(t, "level-zero:0", &[]);
    let name = lz::reported(&found, "LZ-FOUND").unwrap_or_else(|| panic!("{found}"));
    assert!(name.contains("Null Device") && name.contains("1 device(s) visible") && name.contains("FLAT"), "{name}");
    let missing = select_on_null_driver(t, "level-zero:1", &[]);
    let e = lz::reported(&missing, "LZ-ERROR").unwrap_or_else(|| panic!("{missing}"));
    assert!(e.contains("level-zero:1 does not exist") && e.contains("1 Level Zero device(s)"), "{e}");
    let composite = select_on_null_driver(t, "level-zero", &[("ZE_FLAT_DEVICE_HIERARCHY", "COMPOSITE")]);
    assert!(lz::reported(&composite, "LZ-FOUND").is_some_and(|n| n.contains("COMPOSITE")), "{composite}");
}

#[test]
fn a_bad_hierarchy_value_is_an_error() {
    if lz::in_child() {
        return select_in_child();
    }
    let text = select_on_null_driver(
        "a_bad_hierarchy_value_is_an_error",
        "level-zero",
        &[("ZE_FLAT_DEVICE_HIERARCHY", "SIDEWAYS")],
    );
    let e = lz::reported(&text, "LZ-ERROR").unwrap_or_else(|| panic!("{text}"));
    assert!(e.contains("ZE_FLAT_DEVICE_HIERARCHY=SIDEWAYS"), "{e}");
}
