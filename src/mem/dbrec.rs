//! Doorbell records: 8-byte slots (two big-endian 32-bit words) carved, one per cache line, out
//! of shared pinned pages. A QP record holds the RQ producer count (word 0) and the SQ producer
//! count (word 1); a CQ record the consumer index (word 0) and the arm word (word 1); an SRQ
//! record the posted counter (word 0).

use std::sync::{Arc, Mutex};

use core::ptr::NonNull;

use super::dma_buf::DmaBuf;
use crate::error::Result;
use crate::mmio::access::DbWord;

struct Page {
    buf: Arc<DmaBuf>,
    free: Vec<bool>,
}

/// Allocator of doorbell-record slots for one context.
///
/// # Invariants
/// A slot handed out as a [`DbRec`] is marked used until that record is dropped.
pub struct DbRecPool {
    slot_size: usize,
    pages: Mutex<Vec<Page>>,
}

impl core::fmt::Debug for DbRecPool {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DbRecPool")
            .field("slot_size", &self.slot_size)
            .finish_non_exhaustive()
    }
}

impl DbRecPool {
    /// A pool whose slots are `cache_line` bytes (at least 8, a power of two; 64 if unknown).
    pub fn new(cache_line: usize) -> Arc<Self> {
        let slot_size = if cache_line >= 8 && cache_line.is_power_of_two() && cache_line <= 4096 {
            cache_line
        } else {
            64
        };
        Arc::new(Self {
            slot_size,
            pages: Mutex::new(Vec::new()),
        })
    }

    /// Take a zeroed slot.
    ///
    /// # Errors
    /// [`Error::Os`](crate::Error::Os) if a new page cannot be mapped.
    pub fn alloc(self: &Arc<Self>) -> Result<DbRec> {
        let mut pages = self.pages.lock().unwrap_or_else(|p| p.into_inner());
        let found = pages
            .iter()
            .enumerate()
            .find_map(|(pi, p)| p.free.iter().position(|f| *f).map(|si| (pi, si)));
        let (pi, si) = match found {
            Some(x) => x,
            None => {
                let buf = Arc::new(DmaBuf::new(4096)?);
                let n = buf.len() / self.slot_size;
                pages.push(Page {
                    buf,
                    free: vec![true; n],
                });
                (pages.len() - 1, 0)
            }
        };
        let page = &mut pages[pi];
        page.free[si] = false;
        let offset = si * self.slot_size;
        page.buf.fill(offset, 8, 0);
        let base = page.buf.as_ptr();
        // `offset + 8 <= page length` because `si < len / slot_size` and slot_size >= 8.
        let p0 = base.as_ptr().wrapping_add(offset);
        let p1 = p0.wrapping_add(4);
        #[expect(
            clippy::cast_ptr_alignment,
            reason = "slot offsets are multiples of 8 in a page-aligned mapping"
        )]
        let (p0, p1) = (
            NonNull::new(p0.cast::<u32>()),
            NonNull::new(p1.cast::<u32>()),
        );
        let (Some(p0), Some(p1)) = (p0, p1) else {
            unreachable!("mapping is non-null")
        };
        Ok(DbRec {
            // SAFETY: 4-byte aligned (slot_size is a power of two >= 8, page aligned base),
            // inside `page.buf`, which the record keeps alive; only `DbWord` touches the words.
            w0: unsafe { DbWord::from_raw(p0) },
            // SAFETY: as for `w0`, 4 bytes further.
            w1: unsafe { DbWord::from_raw(p1) },
            addr: page.buf.addr() + offset as u64,
            page: page.buf.clone(),
            pool: self.clone(),
            slot: (pi, si),
        })
    }

    fn release(&self, slot: (usize, usize)) {
        let mut pages = self.pages.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pages.get_mut(slot.0) {
            p.free[slot.1] = true;
        }
    }
}

/// One doorbell record (two big-endian words the device reads).
///
/// # Invariants
/// `w0`/`w1` point into `page`, which this record keeps mapped.
#[derive(Debug)]
pub struct DbRec {
    w0: DbWord,
    w1: DbWord,
    addr: u64,
    page: Arc<DmaBuf>,
    pool: Arc<DbRecPool>,
    slot: (usize, usize),
}

impl DbRec {
    /// Address passed to the kernel as `db_addr`.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Word 0 (RQ producer / CQ consumer index / SRQ counter).
    #[inline(always)]
    pub fn word0(&self) -> &DbWord {
        &self.w0
    }

    /// Word 1 (SQ producer / CQ arm).
    #[inline(always)]
    pub fn word1(&self) -> &DbWord {
        &self.w1
    }

    /// A second accessor for word 0 and the page it lives in (hold the page as long as the
    /// accessor: it keeps the word mapped).
    pub(crate) fn word0_with_page(&self) -> (DbWord, Arc<DmaBuf>) {
        // SAFETY: the word lies in `page` (type invariant); the caller holds the returned
        // `Arc` of it next to the accessor, which keeps the mapping alive as long as both.
        (unsafe { self.w0.duplicate() }, self.page.clone())
    }

    /// Zero both words.
    pub fn clear(&self) {
        self.w0.store_be32(0);
        self.w1.store_be32(0);
    }
}

impl Drop for DbRec {
    fn drop(&mut self) {
        let _ = &self.page;
        self.pool.release(self.slot);
    }
}
