mod common;
use common::*;
use faultmap::{Config, Delivery, MapOptions, Pager};

fn fnv(b: &[u8]) -> u64 {
    let mut h = 0xcbf29ce484222325u64;
    for &x in b { h ^= x as u64; h = h.wrapping_mul(0x100000001b3); }
    h
}

fn probe(delivery: Delivery) {
    let file = TestFile::new(64 * PAGE, 7);
    let pager = Pager::new(Config::default().delivery(delivery)).unwrap();
    let map = pager.map_trusted(file.store(), MapOptions::new()).unwrap();
    assert_bytes(&map[..32 * PAGE], &file.data[..32 * PAGE], "parent");
    let (base, len) = (map.as_ptr() as usize, map.len());
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let s = unsafe { std::slice::from_raw_parts(base as *const u8, len) };
        let mut copy = vec![0u8; len];
        for i in 0..len { copy[i] = unsafe { std::ptr::read_volatile(&s[i]) }; }
        let code = if fnv(&copy) == fnv(&file.data) { 0 } else { 1 };
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "{delivery:?} status {status:#x}");
    let st = map.stats();
    eprintln!("{delivery:?} {st:?}");
}

#[test]
fn probe_signal() { probe(Delivery::Signal) }
#[test]
fn probe_handler() { probe(Delivery::Handler) }
