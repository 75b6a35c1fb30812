//! 100 rdma_cm connections set up and torn down between two emulators: afterwards no
//! descriptor of this process and no claimed port is left (its own test binary, so that
//! no other test opens descriptors meanwhile).

mod ucma_common;

use mlx5_ffi::ucma::*;
use ucma_common::*;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn a_hundred_connections_leave_no_descriptor_or_port_behind() {
    let dir = std::env::temp_dir().join("mlx5-emu-rdma-cm");
    let (ea, ep) = (emulator(), emulator());
    let port = port(50);
    let claim = dir.join(format!("ps{:04x}-port{port}", ps::TCP));
    // Warm up (lazily created state), then count.
    drop((Chan::open(&ea), Chan::open(&ep)));
    let fds = open_fds();
    for i in 0..100u32 {
        let l = Chan::open(&ep);
        let lid = l.create_id(ps::TCP, 1).unwrap();
        l.bind(lid, SockAddr::V4 { ip: [0; 4], port }).unwrap();
        l.listen(lid).unwrap();
        assert!(claim.exists());
        let a = Chan::open(&ea);
        let (id, pid) = connect_pair(&a, &l, addr_of(&ep, port), (i + 1, i + 1000));
        if i % 2 == 0 {
            // Orderly: disconnect, both see DISCONNECTED, destroy.
            a.disconnect(id).unwrap();
            l.expect(event::DISCONNECTED);
            l.disconnect(pid).unwrap();
            a.expect(event::DISCONNECTED);
            a.destroy(id).unwrap();
            l.destroy(pid).unwrap();
            l.destroy(lid).unwrap();
        } else {
            // Abrupt: close both files with the connection up; the active close sends a
            // DREQ the passive file sees before it goes too.
            drop(a);
            l.expect(event::DISCONNECTED);
        }
        drop(l);
        assert!(!claim.exists(), "cycle {i} left its port claimed");
    }
    assert_eq!(open_fds(), fds, "descriptors left behind");
}
