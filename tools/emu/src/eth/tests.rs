//! The port's pure parts against independent computations: checksums against a second
//! implementation (64-bit accumulation, end-around carry by `% 0xffff`) and RFC 1071's
//! example, and the steering table against a brute-force reference that reads the frame's
//! description (not the parser) over random rules and frames.

use super::*;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a test frame is made of (the reference reads this, the device reads the bytes).
#[derive(Clone, Copy, Debug)]
struct Desc {
    dmac: [u8; 6],
    smac: [u8; 6],
    vlan: Option<u16>,
    /// 4 or 6 (or 0: an ARP-like non-IP frame).
    ip: u8,
    src4: [u8; 4],
    dst4: [u8; 4],
    src6: [u8; 16],
    dst6: [u8; 16],
    /// 6 TCP, 17 UDP, other: none.
    proto: u8,
    sport: u16,
    dport: u16,
    payload: usize,
}

fn build(d: &Desc, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    let mut f = Vec::new();
    f.extend_from_slice(&d.dmac);
    f.extend_from_slice(&d.smac);
    if let Some(t) = d.vlan {
        f.extend_from_slice(&0x8100u16.to_be_bytes());
        f.extend_from_slice(&t.to_be_bytes());
    }
    let l4_len = match d.proto {
        6 => 20,
        17 => 8,
        _ => 0,
    } + d.payload;
    match d.ip {
        4 => {
            f.extend_from_slice(&0x0800u16.to_be_bytes());
            let total = (20 + l4_len) as u16;
            f.extend_from_slice(&[0x45, 0]);
            f.extend_from_slice(&total.to_be_bytes());
            f.extend_from_slice(&[0, 1, 0x40, 0, 64, d.proto, 0, 0]);
            f.extend_from_slice(&d.src4);
            f.extend_from_slice(&d.dst4);
        }
        6 => {
            f.extend_from_slice(&0x86ddu16.to_be_bytes());
            f.extend_from_slice(&[0x60, 0, 0, 0]);
            f.extend_from_slice(&(l4_len as u16).to_be_bytes());
            f.extend_from_slice(&[d.proto, 64]);
            f.extend_from_slice(&d.src6);
            f.extend_from_slice(&d.dst6);
        }
        _ => f.extend_from_slice(&0x0806u16.to_be_bytes()),
    }
    if d.ip != 0 {
        match d.proto {
            6 => {
                f.extend_from_slice(&d.sport.to_be_bytes());
                f.extend_from_slice(&d.dport.to_be_bytes());
                f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18, 0x20, 0, 0, 0, 0, 0]);
            }
            17 => {
                f.extend_from_slice(&d.sport.to_be_bytes());
                f.extend_from_slice(&d.dport.to_be_bytes());
                f.extend_from_slice(&((8 + d.payload) as u16).to_be_bytes());
                f.extend_from_slice(&[0, 0]);
            }
            _ => {}
        }
    }
    for _ in 0..d.payload {
        f.push(r.next() as u8);
    }
    f
}

/// Independent one's-complement sum: 64-bit accumulation, reduced by `% 0xffff`.
fn ref_sum(parts: &[&[u8]]) -> u16 {
    let mut joined = Vec::new();
    for p in parts {
        joined.extend_from_slice(p);
    }
    if joined.len() % 2 == 1 {
        joined.push(0);
    }
    let s: u64 = joined
        .chunks(2)
        .map(|c| u64::from(c[0]) * 256 + u64::from(c[1]))
        .sum();
    let r = s % 0xffff;
    // The one's-complement sum of non-zero data is never 0 (it is 0xffff then).
    if r == 0 && s != 0 { 0xffff } else { r as u16 }
}

#[test]
fn rfc1071_example_and_ipv4_header() {
    // RFC 1071 section 3: the sum of 00 01 f2 03 f4 f5 f6 f7 is ddf2.
    let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
    assert_eq!(internet_checksum(&data), !0xddf2);
    // A well-known IPv4 header (checksum b861).
    let hdr = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];
    assert_eq!(internet_checksum(&hdr), 0xb861);
}

#[test]
fn offloaded_checksums_match_an_independent_computation() {
    let mut r = Rng(0x5eed);
    for case in 0..300u64 {
        let ip = if case % 2 == 0 { 4 } else { 6 };
        let proto = if case % 3 == 0 { 6 } else { 17 };
        let d = Desc {
            dmac: [1, 0, 0x5e, 0, 0, 1],
            smac: [0, 2, 0xc9, 0xab, 0xcd, 1],
            vlan: (case % 5 == 0).then_some(0x0123),
            ip,
            src4: [10, 0, 0, r.below(255) as u8],
            dst4: [239, 1, 1, 1],
            src6: [0xfd; 16],
            dst6: [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            proto,
            sport: r.below(65536) as u16,
            dport: r.below(65536) as u16,
            payload: r.below(1400) as usize,
        };
        let mut f = build(&d, case);
        fill_checksums(&mut f, true, true);
        let p = parse(&f).expect("parses");
        let l2 = if d.vlan.is_some() { 18 } else { 14 };
        let (l4_off, pseudo) = if ip == 4 {
            assert_eq!(
                ref_sum(&[&f[l2..l2 + 20]]),
                0xffff,
                "IPv4 header sum, case {case}"
            );
            let len = (f.len() - l2 - 20) as u16;
            let mut ph = Vec::new();
            ph.extend_from_slice(&f[l2 + 12..l2 + 20]);
            ph.extend_from_slice(&[0, proto]);
            ph.extend_from_slice(&len.to_be_bytes());
            (l2 + 20, ph)
        } else {
            let len = (f.len() - l2 - 40) as u16;
            let mut ph = Vec::new();
            ph.extend_from_slice(&f[l2 + 8..l2 + 40]);
            ph.extend_from_slice(&[0, proto]);
            ph.extend_from_slice(&len.to_be_bytes());
            (l2 + 40, ph)
        };
        assert_eq!(
            ref_sum(&[&pseudo, &f[l4_off..]]),
            0xffff,
            "L4 sum over the pseudo header, case {case}"
        );
        assert_eq!(verify_checksums(&f, &p), (true, true), "case {case}");
        // One flipped payload (or header) bit: the receive side says so.
        let at = r.below((f.len() - l4_off) as u64) as usize + l4_off;
        f[at] ^= 1 << r.below(8);
        assert!(
            !verify_checksums(&f, &p).1,
            "flipped byte {at} unnoticed, case {case}"
        );
        f[at] ^= 0xff;
        let (_, ext) = cqe_flags(&f, &p);
        assert_eq!(
            ext & 4,
            0,
            "L4 ok reported for a corrupt frame, case {case}"
        );
    }
}

/// The reference: does spec `s` match a frame described by `d`, read from the description.
fn ref_matches(s: &Spec, d: &Desc) -> bool {
    let mm = |have: &[u8], val: &[u8], mask: &[u8]| {
        have.iter()
            .zip(val)
            .zip(mask)
            .all(|((h, v), m)| h & m == v & m)
    };
    let ethertype = match d.ip {
        4 => 0x0800u16,
        6 => 0x86dd,
        _ => 0x0806,
    };
    match *s {
        Spec::Eth {
            dmac,
            smac,
            ethertype: et,
            vlan,
        } => {
            mm(&d.dmac, &dmac[0], &dmac[1])
                && mm(&d.smac, &smac[0], &smac[1])
                && ethertype & et[1] == et[0] & et[1]
                && match d.vlan {
                    Some(t) => t & vlan[1] == vlan[0] & vlan[1],
                    None => vlan[1] == 0,
                }
        }
        Spec::Ipv4 {
            src, dst, proto, ..
        } => {
            d.ip == 4
                && mm(&d.src4, &src[0], &src[1])
                && mm(&d.dst4, &dst[0], &dst[1])
                && d.proto & proto[1] == proto[0] & proto[1]
        }
        Spec::Ipv6 { src, dst, .. } => {
            d.ip == 6 && mm(&d.src6, &src[0], &src[1]) && mm(&d.dst6, &dst[0], &dst[1])
        }
        Spec::Udp { dport, sport } => {
            d.ip != 0
                && d.proto == 17
                && d.dport & dport[1] == dport[0] & dport[1]
                && d.sport & sport[1] == sport[0] & sport[1]
        }
        Spec::Tcp { dport, sport } => {
            d.ip != 0
                && d.proto == 6
                && d.dport & dport[1] == dport[0] & dport[1]
                && d.sport & sport[1] == sport[0] & sport[1]
        }
    }
}

fn pick<T: Copy>(r: &mut Rng, v: &[T]) -> T {
    v[r.below(v.len() as u64) as usize]
}

#[test]
fn the_highest_priority_matching_rule_takes_the_frame_or_it_is_a_counted_miss() {
    let macs = [
        [0, 2, 0xc9, 0xab, 0xcd, 1],
        [0, 2, 0xc9, 0xab, 0xcd, 2],
        [1, 0, 0x5e, 1, 1, 1],
        [0xff; 6],
    ];
    let ip4s = [[10, 0, 0, 1], [10, 0, 0, 2], [239, 1, 1, 1]];
    let ip6s = [[0xfd; 16], [0xfe; 16]];
    let ports = [5000u16, 6000, 319];
    let full = |b: bool| if b { 0xffu8 } else { 0 };
    let mut r = Rng(0xabcdef);
    let (mut hits, mut drops, mut misses) = (0, 0, 0);
    for round in 0..200 {
        let mut t = Table::default();
        // (id, priority, kind rank, insertion order, drop, qpn, specs) for the reference.
        let mut refs = Vec::new();
        for id in 1..=r.below(8) as u32 + 1 {
            let mut specs = Vec::new();
            if r.below(3) > 0 {
                let mk = full(r.below(2) == 0);
                let mac = pick(&mut r, &macs);
                let vm = if r.below(4) == 0 { 0x0fff } else { 0 };
                specs.push(Spec::Eth {
                    dmac: [mac, [mk; 6]],
                    smac: [[0; 6], [0; 6]],
                    ethertype: [0, 0],
                    vlan: [pick(&mut r, &[1u16, 2]), vm],
                });
            }
            match r.below(3) {
                0 => specs.push(Spec::Ipv4 {
                    src: [[0; 4], [0; 4]],
                    dst: [pick(&mut r, &ip4s), [full(r.below(2) == 0); 4]],
                    proto: [17, full(r.below(2) == 0)],
                    tos: [0, 0],
                    ttl: [0, 0],
                }),
                1 => specs.push(Spec::Ipv6 {
                    src: [[0; 16], [0; 16]],
                    dst: [pick(&mut r, &ip6s), [0xff; 16]],
                    next_hdr: [0, 0],
                    tclass: [0, 0],
                    hop_limit: [0, 0],
                    flow_label: [0, 0],
                }),
                _ => {}
            }
            if r.below(2) == 0 {
                let p = [pick(&mut r, &ports), 0xffff];
                specs.push(if r.below(2) == 0 {
                    Spec::Udp {
                        dport: p,
                        sport: [0, 0],
                    }
                } else {
                    Spec::Tcp {
                        dport: p,
                        sport: [0, 0],
                    }
                });
            }
            let kind = match r.below(10) {
                0 => RuleKind::AllDefault,
                1 => RuleKind::McDefault,
                _ => RuleKind::Normal,
            };
            let rule = Rule {
                id,
                ctx: 1,
                qpn: 0x100 + r.below(3) as u32,
                priority: r.below(4) as u16,
                kind,
                drop: r.below(6) == 0,
                specs,
            };
            refs.push(rule.clone());
            t.insert(rule);
        }
        // A destroyed rule never matches again.
        if r.below(3) == 0 {
            let gone = refs.remove(r.below(refs.len() as u64) as usize);
            assert!(t.remove(gone.id));
            assert!(!t.remove(gone.id));
        }
        assert_eq!(t.rules().len(), refs.len());
        for f in 0..50u64 {
            let ip = pick(&mut r, &[0u8, 4, 4, 6]);
            let d = Desc {
                dmac: pick(&mut r, &macs),
                smac: [0, 2, 0xc9, 0xab, 0xcd, 9],
                vlan: pick(&mut r, &[None, Some(1), Some(2)]),
                ip,
                src4: pick(&mut r, &ip4s),
                dst4: pick(&mut r, &ip4s),
                src6: pick(&mut r, &ip6s),
                dst6: pick(&mut r, &ip6s),
                proto: pick(&mut r, &[6u8, 17, 1]),
                sport: pick(&mut r, &ports),
                dport: pick(&mut r, &ports),
                payload: r.below(64) as usize,
            };
            let frame = build(&d, round * 100 + f);
            let p = parse(&frame).expect("a whole frame parses");
            // Reference: the matching normal rule of the lowest priority value (the oldest
            // among equals), else the multicast default (group address), else the
            // catch-all; each kind the oldest of its lowest priority.
            let group = d.dmac[0] & 1 == 1;
            let rank = |x: &Rule| match x.kind {
                RuleKind::Normal => 0,
                RuleKind::McDefault => 1,
                RuleKind::AllDefault => 2,
            };
            let best = refs
                .iter()
                .enumerate()
                .filter(|(_, x)| match x.kind {
                    RuleKind::Normal => x.specs.iter().all(|s| ref_matches(s, &d)),
                    RuleKind::McDefault => group,
                    RuleKind::AllDefault => true,
                })
                .min_by_key(|(i, x)| (rank(x), x.priority, *i))
                .map(|(_, x)| x);
            let want = match best {
                None => Verdict::Miss,
                Some(x) if x.drop => Verdict::Drop { rule: x.id },
                Some(x) => Verdict::Qp {
                    qpn: x.qpn,
                    rule: x.id,
                },
            };
            let got = t.steer(&p);
            assert_eq!(got, want, "round {round} frame {d:?} rules {refs:#?}");
            match got {
                Verdict::Qp { .. } => hits += 1,
                Verdict::Drop { .. } => drops += 1,
                Verdict::Miss => misses += 1,
            }
        }
    }
    // The random space exercises all three outcomes.
    assert!(
        hits > 500 && drops > 50 && misses > 500,
        "{hits} {drops} {misses}"
    );
}

#[test]
fn runts_garbage_and_truncated_headers_never_panic() {
    let mut r = Rng(77);
    for len in 0..200usize {
        for _ in 0..20 {
            let mut f: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
            if len >= 14 && r.below(2) == 0 {
                let t: u16 = pick(&mut r, &[0x0800, 0x86dd, 0x8100]);
                f[12..14].copy_from_slice(&t.to_be_bytes());
                if len > 14 {
                    f[14] = pick(&mut r, &[0x45, 0x4f, 0x60, 0x41]);
                }
            }
            match parse(&f) {
                None => assert!(len < MIN_FRAME),
                Some(p) => {
                    let _ = cqe_flags(&f, &p);
                    let mut g = f.clone();
                    fill_checksums(&mut g, true, true);
                    assert_eq!(g.len(), f.len());
                }
            }
        }
    }
}
