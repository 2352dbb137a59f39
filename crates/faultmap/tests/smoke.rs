use faultmap::{Config, MapOptions, MemStore, Pager};

#[test]
fn reads_back_a_buffer() {
    let data: Vec<u8> = (0..(5 << 20) + 123).map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let pager = Pager::new(Config::default()).unwrap();
    for order in [0u8, 4, 9] {
        let map = pager
            .map(MemStore::new("m", data.clone()), MapOptions::new().fault_around_order(order))
            .unwrap();
        assert_eq!(&map[..], &data[..]);
        let s = map.stats();
        eprintln!("order {order}: {s:?}");
    }
}
