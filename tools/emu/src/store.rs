//! Emulating the stores of a doorbell in the fault handler (x86-64; `docs/emulator-wake.md`,
//! *Doorbell stores emulated in the ringing thread*).
//!
//! A store to a write-protected UAR page faults before it lands. Instead of opening the page
//! and letting the CPU retry the store, the fault handler can decode the instruction, write
//! the value itself through the device's own mapping of the page, and move the instruction
//! pointer past it: the page stays protected, so nobody has to re-protect it, and the
//! doorbell is known to have landed when the handler looks at it. A BlueFlame copy is
//! several stores (eight 8-byte `mov`s in libmlx5, four SSE stores in our driver, two AVX
//! stores in glibc's `memcpy` as UCX uses it), so after the faulting store the handler goes
//! on through the straight-line code that follows while it is made of nothing but stores to
//! the same page, register loads from ordinary memory and `lea`: the whole block lands in
//! one fault.
//!
//! Only forms whose semantics are plain data movement are decoded (no flags are read or
//! written by any of them): `mov r/m, r` (32/64-bit), `mov r, r/m` (loads, 32/64-bit), `lea`,
//! and the SSE/AVX register-to-memory moves (`movdqa`, `movdqu`, `movaps`, `movups`,
//! `movapd`, `movupd`, `movntdq`, `movntps`, `movntpd`, VEX-encoded 128- and 256-bit). The
//! first instruction that is anything else (or a store elsewhere, or a load that would
//! fault) ends the run there, and the CPU executes it. A faulting instruction that is not
//! one of these is not emulated at all: the caller falls back to opening the page.
//!
//! This module only decodes and interprets; it reaches registers and memory through
//! [`Machine`], so it is tested on a model (`tests` below) as well as on the real signal
//! context (`watch.rs`).

/// Longest x86 instruction.
pub(crate) const MAX_INSN: usize = 15;

/// The interrupted thread, as far as the interpreter needs it.
pub(crate) trait Machine {
    /// General-purpose register `r` (0 = rax ... 15 = r15, the encoding's numbering).
    fn gpr(&self, r: u8) -> u64;
    fn set_gpr(&mut self, r: u8, v: u64);
    fn rip(&self) -> u64;
    fn set_rip(&mut self, v: u64);
    /// The low 128 bits of vector register `r`.
    fn xmm(&self, r: u8) -> [u8; 16];
    /// Bits 128..256 of vector register `r` (`None`: not available in this context).
    fn ymm_hi(&self, r: u8) -> Option<[u8; 16]>;
    /// Read ordinary memory without faulting (false: not readable).
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool;
    /// Perform a store to the watched page (false: not possible there, not done).
    fn store(&mut self, addr: u64, bytes: &[u8]) -> bool;
}

/// A memory operand: `base + index * scale + disp` (or `rip_next + disp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mem {
    base: Option<u8>,
    index: Option<(u8, u8)>,
    disp: i64,
    rip_relative: bool,
}

/// What one decoded instruction does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Store `size` bytes of general-purpose register `src`.
    StoreGpr { src: u8, size: u8, mem: Mem },
    /// Store `size` (16 or 32) bytes of vector register `src`.
    StoreVec { src: u8, size: u8, mem: Mem },
    /// Load `size` (4, zero-extended, or 8) bytes into `dst`.
    Load { dst: u8, size: u8, mem: Mem },
    /// `dst = address of mem` (`size` 4: truncated and zero-extended).
    Lea { dst: u8, size: u8, mem: Mem },
}

/// One decoded instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Insn {
    pub(crate) len: u8,
    pub(crate) op: Op,
}

impl Insn {
    /// The store's operand, if it is a store.
    fn store(&self) -> Option<(Mem, u8)> {
        match self.op {
            Op::StoreGpr { size, mem, .. } | Op::StoreVec { size, mem, .. } => Some((mem, size)),
            _ => None,
        }
    }
}

/// Decode the instruction at the start of `code` (at least [`MAX_INSN`] bytes, or what was
/// readable). `None`: not one of the forms above.
pub(crate) fn decode(code: &[u8]) -> Option<Insn> {
    let mut i = 0;
    let mut opsize = false;
    let mut rep = false;
    let mut repne = false;
    // Legacy prefixes (any other, e.g. a segment override, lock, or address size, declines).
    loop {
        match *code.get(i)? {
            0x66 => opsize = true,
            0xf3 => rep = true,
            0xf2 => repne = true,
            _ => break,
        }
        i += 1;
        if i > 4 {
            return None;
        }
    }
    let b = *code.get(i)?;
    if b == 0xc4 || b == 0xc5 {
        if opsize || rep || repne {
            return None;
        }
        return decode_vex(code, i);
    }
    let mut rex = 0u8;
    if b & 0xf0 == 0x40 {
        rex = b;
        i += 1;
    }
    let (w, r, x, bb) = (rex & 8 != 0, (rex >> 2) & 1, (rex >> 1) & 1, rex & 1);
    let op = *code.get(i)?;
    i += 1;
    if op == 0x0f {
        let op2 = *code.get(i)?;
        i += 1;
        // Register-to-memory vector moves: 0F 29 movaps (66: movapd), 0F 11 movups (66:
        // movupd; F3/F2 are movss/movsd, 4/8 bytes, declined), 66 0F 7F movdqa, F3 0F 7F
        // movdqu, 66 0F E7 movntdq, 0F 2B movntps (66: movntpd).
        let ok = matches!(
            (op2, opsize, rep, repne),
            (0x29 | 0x11 | 0x2b, _, false, false)
                | (0x7f, true, false, false)
                | (0x7f, false, true, false)
                | (0xe7, true, false, false)
        );
        if !ok || (opsize && rep) {
            return None;
        }
        let (reg, mem, n) = modrm(code, i, r, x, bb)?;
        let mem = mem?;
        return Some(Insn {
            len: u8::try_from(n).ok()?,
            op: Op::StoreVec {
                src: reg,
                size: 16,
                mem,
            },
        });
    }
    if opsize || rep || repne {
        return None;
    }
    let size = if w { 8 } else { 4 };
    let (reg, mem, n) = match op {
        0x89 | 0x8b | 0x8d => modrm(code, i, r, x, bb)?,
        _ => return None,
    };
    let mem = mem?;
    let op = match op {
        0x89 => Op::StoreGpr {
            src: reg,
            size,
            mem,
        },
        0x8b => Op::Load {
            dst: reg,
            size,
            mem,
        },
        _ => Op::Lea {
            dst: reg,
            size,
            mem,
        },
    };
    Some(Insn {
        len: u8::try_from(n).ok()?,
        op,
    })
}

/// VEX-encoded vector stores (`c5` two-byte and `c4` three-byte forms, map 0F only).
fn decode_vex(code: &[u8], at: usize) -> Option<Insn> {
    let (r, x, bb, map, vvvv, l, pp, mut i) = if code[at] == 0xc5 {
        let p = *code.get(at + 1)?;
        (
            (!p >> 7) & 1,
            0,
            0,
            1,
            (!p >> 3) & 0xf,
            (p >> 2) & 1,
            p & 3,
            at + 2,
        )
    } else {
        let p1 = *code.get(at + 1)?;
        let p2 = *code.get(at + 2)?;
        (
            (!p1 >> 7) & 1,
            (!p1 >> 6) & 1,
            (!p1 >> 5) & 1,
            p1 & 0x1f,
            (!p2 >> 3) & 0xf,
            (p2 >> 2) & 1,
            p2 & 3,
            at + 3,
        )
    };
    if map != 1 || vvvv != 0 {
        return None;
    }
    let op = *code.get(i)?;
    i += 1;
    // pp: 0 none, 1 = 66, 2 = F3, 3 = F2.
    let ok = matches!(
        (op, pp),
        (0x29 | 0x11 | 0x2b, 0 | 1) | (0x7f, 1 | 2) | (0xe7, 1)
    );
    if !ok {
        return None;
    }
    let (reg, mem, n) = modrm(code, i, r, x, bb)?;
    Some(Insn {
        len: u8::try_from(n).ok()?,
        op: Op::StoreVec {
            src: reg,
            size: if l == 1 { 32 } else { 16 },
            mem: mem?,
        },
    })
}

/// ModRM (+ SIB + displacement) at `i`: the reg field, the memory operand (`None` for a
/// register operand) and the instruction's total length.
fn modrm(code: &[u8], mut i: usize, r: u8, x: u8, b: u8) -> Option<(u8, Option<Mem>, usize)> {
    let m = *code.get(i)?;
    i += 1;
    let md = m >> 6;
    let reg = ((m >> 3) & 7) | (r << 3);
    let rm = m & 7;
    if md == 3 {
        return Some((reg, None, i));
    }
    let mut mem = Mem {
        base: None,
        index: None,
        disp: 0,
        rip_relative: false,
    };
    if rm == 4 {
        let sib = *code.get(i)?;
        i += 1;
        let scale = 1u8 << (sib >> 6);
        let index = ((sib >> 3) & 7) | (x << 3);
        if index != 4 {
            mem.index = Some((index, scale));
        }
        let base = sib & 7;
        if base == 5 && md == 0 {
            mem.disp = i64::from(i32::from_le_bytes(code.get(i..i + 4)?.try_into().ok()?));
            i += 4;
        } else {
            mem.base = Some(base | (b << 3));
        }
    } else if rm == 5 && md == 0 {
        mem.rip_relative = true;
        mem.disp = i64::from(i32::from_le_bytes(code.get(i..i + 4)?.try_into().ok()?));
        i += 4;
    } else {
        mem.base = Some(rm | (b << 3));
    }
    match md {
        1 => {
            mem.disp = i64::from(*code.get(i)? as i8);
            i += 1;
        }
        2 => {
            mem.disp = i64::from(i32::from_le_bytes(code.get(i..i + 4)?.try_into().ok()?));
            i += 4;
        }
        _ => {}
    }
    Some((reg, Some(mem), i))
}

/// The effective address of `mem` for an instruction of `len` bytes at `rip`.
fn address(m: &impl Machine, mem: &Mem, len: u8) -> u64 {
    let mut a = mem.disp as u64;
    if mem.rip_relative {
        a = a.wrapping_add(m.rip()).wrapping_add(u64::from(len));
    }
    if let Some(b) = mem.base {
        a = a.wrapping_add(m.gpr(b));
    }
    if let Some((ix, sc)) = mem.index {
        a = a.wrapping_add(m.gpr(ix).wrapping_mul(u64::from(sc)));
    }
    a
}

/// What [`run`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ran {
    /// Stores performed (0: nothing was emulated; the faulting instruction must be handled
    /// another way).
    pub(crate) stores: u32,
    /// Bytes stored.
    pub(crate) bytes: u32,
    /// Instructions emulated in all.
    pub(crate) insns: u32,
}

/// At most this many instructions are interpreted in one fault.
pub(crate) const MAX_RUN: u32 = 64;

/// Emulate the faulting store at the interrupted instruction pointer (its address must lie
/// in `[page, page + 4096)`, the page that faulted), then every following instruction while
/// it is a store into the same page, a load from readable memory or a `lea`. Registers and
/// the instruction pointer are updated as the CPU would have; the run stops before the first
/// instruction it does not take, which the CPU then executes.
pub(crate) fn run(m: &mut impl Machine, page: u64) -> Ran {
    let mut ran = Ran::default();
    while ran.insns < MAX_RUN {
        let mut code = [0u8; MAX_INSN];
        let rip = m.rip();
        // Fetch what is readable: the last instruction of a mapping may end near its end.
        let to_end = (4096 - (rip & 4095)) as usize;
        let mut got = MAX_INSN;
        if !m.read(rip, &mut code) {
            // Near the end of the code's mapping: what is readable (rarely taken).
            got = to_end.min(MAX_INSN);
            while got > 0 && !m.read(rip, &mut code[..got]) {
                got -= 1;
            }
        }
        let Some(insn) = decode(&code[..got]) else {
            break;
        };
        let first = ran.insns == 0;
        if first && insn.store().is_none() {
            break;
        }
        match insn.op {
            Op::StoreGpr { src, size, mem } => {
                let a = address(m, &mem, insn.len);
                let v = m.gpr(src).to_le_bytes();
                if !in_page(a, u64::from(size), page) || !m.store(a, &v[..usize::from(size)]) {
                    break;
                }
                ran.stores += 1;
                ran.bytes += u32::from(size);
            }
            Op::StoreVec { src, size, mem } => {
                let a = address(m, &mem, insn.len);
                let mut v = [0u8; 32];
                v[..16].copy_from_slice(&m.xmm(src));
                if size == 32 {
                    let Some(hi) = m.ymm_hi(src) else { break };
                    v[16..].copy_from_slice(&hi);
                }
                if !in_page(a, u64::from(size), page) || !m.store(a, &v[..usize::from(size)]) {
                    break;
                }
                ran.stores += 1;
                ran.bytes += u32::from(size);
            }
            Op::Load { dst, size, mem } => {
                // The stack pointer is never an emulated destination.
                if dst == 4 {
                    break;
                }
                let a = address(m, &mem, insn.len);
                let mut v = [0u8; 8];
                if !m.read(a, &mut v[..usize::from(size)]) {
                    break;
                }
                m.set_gpr(dst, u64::from_le_bytes(v));
            }
            Op::Lea { dst, size, mem } => {
                if dst == 4 {
                    break;
                }
                let a = address(m, &mem, insn.len);
                m.set_gpr(dst, if size == 4 { a & 0xffff_ffff } else { a });
            }
        }
        m.set_rip(rip.wrapping_add(u64::from(insn.len)));
        ran.insns += 1;
    }
    ran
}

/// `[a, a + len)` lies in the page at `page`.
fn in_page(a: u64, len: u64, page: u64) -> bool {
    a >= page && a.checked_add(len).is_some_and(|e| e <= page + 4096)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A model machine: registers, code at `rip`, readable memory and the watched page.
    struct Model {
        gpr: [u64; 16],
        xmm: [[u8; 32]; 16],
        rip: u64,
        mem: BTreeMap<u64, u8>,
        page: u64,
        stored: Vec<(u64, Vec<u8>)>,
    }

    impl Model {
        fn new(code: &[u8]) -> Model {
            let mut mem = BTreeMap::new();
            for (i, &b) in code.iter().enumerate() {
                mem.insert(0x1000 + i as u64, b);
            }
            let mut xmm = [[0u8; 32]; 16];
            for (r, v) in xmm.iter_mut().enumerate() {
                for (i, b) in v.iter_mut().enumerate() {
                    *b = (r * 32 + i) as u8;
                }
            }
            Model {
                gpr: [0; 16],
                xmm,
                rip: 0x1000,
                mem,
                page: 0x7000,
                stored: Vec::new(),
            }
        }
    }

    impl Machine for Model {
        fn gpr(&self, r: u8) -> u64 {
            self.gpr[usize::from(r)]
        }
        fn set_gpr(&mut self, r: u8, v: u64) {
            self.gpr[usize::from(r)] = v;
        }
        fn rip(&self) -> u64 {
            self.rip
        }
        fn set_rip(&mut self, v: u64) {
            self.rip = v;
        }
        fn xmm(&self, r: u8) -> [u8; 16] {
            self.xmm[usize::from(r)][..16].try_into().unwrap()
        }
        fn ymm_hi(&self, r: u8) -> Option<[u8; 16]> {
            Some(self.xmm[usize::from(r)][16..].try_into().unwrap())
        }
        fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
            for (i, b) in buf.iter_mut().enumerate() {
                match self.mem.get(&(addr + i as u64)) {
                    Some(&v) => *b = v,
                    None => return false,
                }
            }
            true
        }
        fn store(&mut self, addr: u64, bytes: &[u8]) -> bool {
            assert!(addr >= self.page && addr + bytes.len() as u64 <= self.page + 4096);
            self.stored.push((addr, bytes.to_vec()));
            true
        }
    }

    #[test]
    fn libmlx5_blueflame_block_is_one_run() {
        // The 64-byte block of libmlx5's copy (rdx holds the first word, r11 the source,
        // rax the destination + 0x40, rcx the destination), then `cmp` ends the run.
        let code = [
            0x48, 0x89, 0x50, 0xc0, 0x49, 0x8b, 0x53, 0x08, 0x48, 0x89, 0x50, 0xc8, 0x49, 0x8b,
            0x53, 0x10, 0x48, 0x89, 0x50, 0xd0, 0x49, 0x8b, 0x53, 0x18, 0x48, 0x89, 0x50, 0xd8,
            0x49, 0x8b, 0x53, 0x20, 0x48, 0x89, 0x50, 0xe0, 0x49, 0x8b, 0x53, 0x28, 0x48, 0x89,
            0x50, 0xe8, 0x49, 0x8b, 0x53, 0x30, 0x48, 0x89, 0x50, 0xf0, 0x49, 0x8d, 0x53, 0x40,
            0x49, 0x8b, 0x73, 0x38, 0x48, 0x89, 0x71, 0x38, 0x49, 0x39, 0x94, 0x24, 0x00, 0x03,
            0x00, 0x00,
        ];
        let mut m = Model::new(&code);
        let src = 0x3000u64;
        for i in 0..64u64 {
            m.mem.insert(src + i, i as u8 + 1);
        }
        m.gpr[11] = src;
        m.gpr[2] = u64::from_le_bytes([1, 2, 3, 4, 5, 6, 7, 8]);
        m.gpr[0] = 0x7800 + 0x40;
        m.gpr[1] = 0x7800;
        let ran = run(&mut m, 0x7000);
        assert_eq!((ran.stores, ran.bytes, ran.insns), (8, 64, 16));
        assert_eq!(m.rip, 0x1000 + 64, "stopped at the cmp");
        let mut bytes = vec![0u8; 64];
        for (a, b) in &m.stored {
            let o = (a - 0x7800) as usize;
            bytes[o..o + b.len()].copy_from_slice(b);
        }
        assert_eq!(bytes, (1..=64).collect::<Vec<u8>>());
        assert_eq!(m.gpr[2], src + 0x40, "lea");
        assert_eq!(
            m.gpr[6],
            u64::from_le_bytes([57, 58, 59, 60, 61, 62, 63, 64])
        );
    }

    #[test]
    fn sse_and_avx_stores_take_their_register() {
        // movdqa [rdi], xmm0; movdqa [rdi+16], xmm1; vmovdqu [rdi+32], ymm2 (c5 fe 7f 57 20);
        // then ret.
        let code = [
            0x66, 0x0f, 0x7f, 0x07, 0x66, 0x0f, 0x7f, 0x4f, 0x10, 0xc5, 0xfe, 0x7f, 0x57, 0x20,
            0xc3,
        ];
        let mut m = Model::new(&code);
        m.gpr[7] = 0x7900;
        let ran = run(&mut m, 0x7000);
        assert_eq!((ran.stores, ran.bytes), (3, 64));
        assert_eq!(m.stored[0], (0x7900, m.xmm[0][..16].to_vec()));
        assert_eq!(m.stored[1], (0x7910, m.xmm[1][..16].to_vec()));
        assert_eq!(m.stored[2], (0x7920, m.xmm[2].to_vec()));
        assert_eq!(m.rip, 0x1000 + 14);
    }

    #[test]
    fn glibc_memcpy_tail_with_sib_and_three_byte_vex() {
        // vmovdqu [rdi], ymm0 (c5 fe 7f 07); vmovdqu [rdi+rdx-0x20], ymm1 (c5 fe 7f 4c 17 e0);
        // a three-byte VEX vmovdqa [r8], xmm3 (c4 c1 79 7f 18); vzeroupper.
        let code = [
            0xc5, 0xfe, 0x7f, 0x07, 0xc5, 0xfe, 0x7f, 0x4c, 0x17, 0xe0, 0xc4, 0xc1, 0x79, 0x7f,
            0x18, 0xc5, 0xf8, 0x77,
        ];
        let mut m = Model::new(&code);
        m.gpr[7] = 0x7800;
        m.gpr[2] = 64;
        m.gpr[8] = 0x7a00;
        let ran = run(&mut m, 0x7000);
        assert_eq!(ran.stores, 3);
        assert_eq!(m.stored[1].0, 0x7820);
        assert_eq!(m.stored[2], (0x7a00, m.xmm[3][..16].to_vec()));
        assert_eq!(m.rip, 0x1000 + 15);
    }

    #[test]
    fn a_store_outside_the_page_or_an_unreadable_load_ends_the_run() {
        // mov [rax], rdx; mov [rbx], rdx (another page); both decoded, the second not taken.
        let code = [0x48, 0x89, 0x10, 0x48, 0x89, 0x13];
        let mut m = Model::new(&code);
        m.gpr[0] = 0x7ff8;
        m.gpr[3] = 0x8000;
        assert_eq!(run(&mut m, 0x7000).stores, 1);
        assert_eq!(m.rip, 0x1003);
        // mov [rax], rdx; mov rcx, [rbx] (unreadable).
        let code = [0x48, 0x89, 0x10, 0x48, 0x8b, 0x0b];
        let mut m = Model::new(&code);
        m.gpr[0] = 0x7000;
        m.gpr[3] = 0x5000;
        m.gpr[1] = 99;
        assert_eq!(run(&mut m, 0x7000).insns, 1);
        assert_eq!((m.rip, m.gpr[1]), (0x1003, 99));
        // A store straddling the page's end is not taken at all.
        let code = [0x48, 0x89, 0x10];
        let mut m = Model::new(&code);
        m.gpr[0] = 0x7ffc;
        assert_eq!(run(&mut m, 0x7000), Ran::default());
        assert_eq!(m.rip, 0x1000);
    }

    #[test]
    fn what_is_not_a_plain_store_is_declined() {
        for code in [
            &[0xf3, 0xa4][..],                     // rep movsb
            &[0x88, 0x10],                         // mov [rax], dl (8-bit)
            &[0x66, 0x89, 0x10],                   // mov [rax], dx (16-bit)
            &[0x48, 0x89, 0xd0],                   // mov rax, rdx (register form)
            &[0xf0, 0x48, 0x89, 0x10],             // lock prefix
            &[0x64, 0x48, 0x89, 0x10],             // fs segment override
            &[0x67, 0x48, 0x89, 0x10],             // address size
            &[0xf3, 0x0f, 0x11, 0x00],             // movss (4 bytes)
            &[0x66, 0x0f, 0x6f, 0x00],             // movdqa load
            &[0xc5, 0xf9, 0x6f, 0x00],             // vmovdqa load
            &[0xc5, 0xf1, 0x7f, 0x00],             // vvvv != 1111
            &[0x62, 0xf1, 0x7e, 0x48, 0x7f, 0x00], // EVEX
            &[0x48, 0x89],                         // truncated
        ] {
            assert_eq!(decode(code), None, "{code:02x?}");
        }
        // A load or lea is decoded but never emulated as the first instruction.
        let mut m = Model::new(&[0x48, 0x8b, 0x10]);
        assert_eq!(run(&mut m, 0x7000), Ran::default());
    }

    #[test]
    fn rip_relative_and_sib_without_base_compute_their_address() {
        // mov [rip + 0x10], eax: 89 05 10 00 00 00 (6 bytes); a 4-byte store.
        let i = decode(&[0x89, 0x05, 0x10, 0, 0, 0]).unwrap();
        assert_eq!(i.len, 6);
        let m = Model::new(&[]);
        let Op::StoreGpr { mem, size, .. } = i.op else {
            panic!()
        };
        assert_eq!((address(&m, &mem, i.len), size), (0x1000 + 6 + 0x10, 4));
        // mov [rcx*8 + 0x7000], r9: 4c 89 0c cd 00 70 00 00.
        let i = decode(&[0x4c, 0x89, 0x0c, 0xcd, 0x00, 0x70, 0, 0]).unwrap();
        let mut m = Model::new(&[]);
        m.gpr[1] = 3;
        let Op::StoreGpr { mem, src, .. } = i.op else {
            panic!()
        };
        assert_eq!((address(&m, &mem, i.len), src, i.len), (0x7018, 9, 8));
    }
}
