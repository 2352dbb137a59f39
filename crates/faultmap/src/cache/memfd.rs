//! The page cache of one object: a memfd, its alias mapping, and the
//! page-state array.
//!
//! Page *i* of the object is page *i* of its memfd: shmem with 4 KiB
//! pages, hugetlb (`MFD_HUGETLB`) with 2 MiB pages ([`PageSize`]). The memfd
//! is exactly the object's length rounded up to a page, so the kernel itself
//! refuses to map anything past the last page; bytes past the object's end in
//! the last page are zero, as in a kernel file mapping.
//!
//! A hugetlb memfd takes its pages from the kernel's pool of huge pages
//! (`vm.nr_hugepages`). Its mappings reserve nothing (`MAP_NORESERVE`):
//! each fill first allocates its pages (`fallocate`), so a pool that ran dry
//! fails that read (`ENOSPC`) instead of raising SIGBUS in the middle of a
//! store's copy, and an object under a memory budget needs only about as
//! many huge pages as its budget holds. The check when the cache is made
//! ([`CacheError::HugePages`]) is a check, not a reservation: another
//! object or process can take the pool's pages later, and then reads fail
//! (the faults that wait for them get SIGBUS, as for any failed read).
//!
//! Pages are filled through the *alias*: a `MAP_SHARED` read-write mapping of
//! the whole memfd that is never registered with userfaultfd. The store reads
//! straight into it (no bounce buffer), which allocates the shmem pages; the
//! application's mappings of the same memfd are registered MISSING|MINOR, so
//! they see a page only when the fault path maps it with `UFFDIO_CONTINUE`.
//!
//! The page-state array holds one [`PageState`] word per page, in chunks of
//! 512 pages (one 4 KiB chunk per 2 MiB of object) installed on the first
//! state change in the chunk. A sparse terabyte object costs its chunk
//! directory (8 bytes per 2 MiB) plus the chunks it touched. The chunks come
//! pre-zeroed from a process-wide pool (`pool`, refilled by its own thread),
//! so a first touch on the fault path does not allocate; the signal handler
//! only looks chunks up. Chunks leave the array only with the object (back to
//! the pool, zeroed, or freed), so a `&PageState` is valid for the object's
//! life and a lock-free reader never touches a reused chunk.

use std::ffi::CString;
use std::ops::Range;
use std::os::fd::OwnedFd;

use crate::base::config::PageSize;
use crate::base::index::ObjectPage;
use crate::cache::page_state::{PageState, Word};
use crate::store::ReadBuf;
use crate::sync::{AtomicPtr, Ordering};
use crate::sys::{self, MappedRegion};

/// Pages per chunk of the page-state array: one PTE table's worth.
#[cfg(not(loom))]
const CHUNK_PAGES: usize = 512;
/// Under loom, chunks shrink so that the models stay small.
#[cfg(loom)]
const CHUNK_PAGES: usize = 2;

/// One chunk of the page-state array: `CHUNK_PAGES` words, all ABSENT (zero)
/// when it is installed. Chunks are made, zeroed and recycled by `pool`.
pub(crate) struct Chunk(pub(crate) [PageState; CHUNK_PAGES]);

impl Chunk {
    /// A new chunk of ABSENT words, from the allocator. The fault path takes
    /// chunks from the pool ([`crate::cache::pool::alloc`]) instead.
    pub(crate) fn new_boxed() -> Box<Self> {
        Box::new(Chunk(std::array::from_fn(|_| PageState::new())))
    }

    /// Resets every word to ABSENT. `&mut`: nobody else can see the chunk.
    pub(crate) fn clear(&mut self) {
        for word in &mut self.0 {
            *word = PageState::new();
        }
    }

    /// Whether every word is ABSENT with no flags, pins or version: as new.
    pub(crate) fn is_clear(&self) -> bool {
        self.0.iter().all(|w| w.load() == Word::ABSENT)
    }
}

/// The page-state words of an object, allocated in chunks on first use.
pub(crate) struct PageStates {
    dir: Box<[AtomicPtr<Chunk>]>,
    pages: u64,
}

impl PageStates {
    /// The array of an object of `pages` pages, no chunk installed yet.
    /// Starts the pool's refill thread on first use (not a fault path).
    pub(crate) fn new(pages: u64) -> Self {
        crate::cache::pool::start();
        let chunks = pages.div_ceil(CHUNK_PAGES as u64) as usize;
        let dir = (0..chunks)
            .map(|_| AtomicPtr::new(std::ptr::null_mut()))
            .collect();
        Self { dir, pages }
    }

    fn chunk_of(&self, page: ObjectPage) -> Option<(&AtomicPtr<Chunk>, usize)> {
        let page = page.0;
        if page >= self.pages {
            return None;
        }
        let slot = &self.dir[(page / CHUNK_PAGES as u64) as usize];
        Some((slot, (page % CHUNK_PAGES as u64) as usize))
    }

    /// The word of `page`, if its chunk exists. `None` means ABSENT (or out
    /// of range).
    pub(crate) fn get(&self, page: ObjectPage) -> Option<&PageState> {
        let (slot, i) = self.chunk_of(page)?;
        // Acquire: pairs with the Release of the CAS that published the chunk,
        // so its initialised words are visible.
        let chunk = slot.load(Ordering::Acquire);
        // SAFETY: a non-null pointer in the directory points to a Chunk that
        // was fully initialised before it was published and is freed only in
        // Drop, which needs `&mut self`.
        unsafe { chunk.as_ref() }.map(|c| &c.0[i])
    }

    /// The loaded word of `page`: ABSENT if its chunk does not exist.
    pub(crate) fn load(&self, page: ObjectPage) -> Word {
        self.get(page).map_or(Word::ABSENT, PageState::load)
    }

    /// The word of `page`, installing its chunk on first use. `None` only if
    /// `page` is out of range. The chunk comes from the pool: this allocates
    /// only on a pool miss, and is never called from the signal handler.
    pub(crate) fn get_or_alloc(&self, page: ObjectPage) -> Option<&PageState> {
        if let Some(state) = self.get(page) {
            return Some(state);
        }
        let (slot, i) = self.chunk_of(page)?;
        let fresh = Box::into_raw(crate::cache::pool::alloc());
        let chunk = match slot.compare_exchange(
            std::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => fresh,
            Err(winner) => {
                // SAFETY: `fresh` came from Box::into_raw above and was never
                // published: we still own it. It goes back to the pool.
                crate::cache::pool::give_back(unsafe { Box::from_raw(fresh) });
                winner
            }
        };
        // SAFETY: `chunk` is non-null (ours or the winner's), initialised, and
        // lives until Drop (see `get`).
        Some(unsafe { &(*chunk).0[i] })
    }

    /// The object's length in pages.
    pub(crate) fn pages(&self) -> u64 {
        self.pages
    }

    /// Calls `f` with every DIRTY page (and its word), skipping chunks
    /// never installed: O(installed chunks' pages). For the flusher.
    pub(crate) fn for_each_dirty(&self, mut f: impl FnMut(ObjectPage, Word)) {
        for (c, slot) in self.dir.iter().enumerate() {
            let chunk = slot.load(Ordering::Acquire);
            // SAFETY: as in `get`: a published chunk lives until Drop.
            let Some(chunk) = (unsafe { chunk.as_ref() }) else {
                continue;
            };
            for (i, state) in chunk.0.iter().enumerate() {
                let word = state.load();
                if word.is_dirty() {
                    f(ObjectPage((c * CHUNK_PAGES + i) as u64), word);
                }
            }
        }
    }

    /// How many pages are in the active set (`crate::policy::clock`), skipping
    /// chunks never allocated.
    pub(crate) fn count_active(&self) -> u64 {
        let mut n = 0;
        let mut p = 0;
        while p < self.pages {
            if self.get(ObjectPage(p)).is_none() {
                p += CHUNK_PAGES as u64;
                continue;
            }
            n += u64::from(self.load(ObjectPage(p)).is_active());
            p += 1;
        }
        n
    }

    /// How many pages are UPTODATE. O(pages); for statistics and tests.
    pub(crate) fn count_uptodate(&self) -> u64 {
        (0..self.pages)
            .filter(|&p| {
                self.load(ObjectPage(p)).state() == crate::cache::page_state::State::UpToDate
            })
            .count() as u64
    }
}

/// The readahead policy's view of the cache: a page is cached while it is
/// up to date or being read.
impl crate::policy::readahead::CacheView for PageStates {
    fn is_cached(&self, index: u64) -> bool {
        matches!(
            self.load(ObjectPage(index)).state(),
            crate::cache::page_state::State::UpToDate | crate::cache::page_state::State::Reading
        )
    }
}

impl Drop for PageStates {
    fn drop(&mut self) {
        for slot in self.dir.iter() {
            let chunk = slot.load(Ordering::Acquire);
            if !chunk.is_null() {
                // SAFETY: published chunks came from Box::into_raw and leave
                // the directory only here, once; `&mut self` excludes readers,
                // so no `&PageState` into the chunk outlives this.
                crate::cache::pool::give_back(unsafe { Box::from_raw(chunk) });
            }
        }
    }
}

/// The largest object faultmap caches: shmem's own limit (`MAX_LFS_FILESIZE`
/// on 64-bit, 2^63 - 1 rounded down to a page).
const MAX_OBJECT_BYTES: u64 = (i64::MAX as u64) & !(crate::sys::HUGE_PAGE_SIZE as u64 - 1);

/// Huge pages a budgeted object of 2 MiB pages needs beyond its budget:
/// reads in flight while the evictor catches up.
const BUDGET_HEADROOM: u64 = 4;

/// The kernel's limit on a memfd name (`MFD_NAME_MAX_LEN`, 249 bytes), less
/// the "faultmap:" prefix.
const MEMFD_NAME_MAX: usize = 249 - "faultmap:".len();

/// The memfd's name, shown in `/proc/PID/maps`: "faultmap:" and the end of
/// the store's name (the most telling part of a long path), cut at a
/// character boundary to the kernel's limit; NUL bytes become '?'.
fn memfd_name(name: &str) -> CString {
    let name = name.replace('\0', "?");
    let mut start = name.len().saturating_sub(MEMFD_NAME_MAX);
    while !name.is_char_boundary(start) {
        start += 1;
    }
    CString::new(format!("faultmap:{}", &name[start..]))
        .unwrap_or_else(|_| CString::from(c"faultmap"))
}

/// The error of [`Cache::allocate`] when the pool of huge pages has none
/// left (`ENOSPC`), inside an `io::Error`: [`PoolEmpty::is`] tells it.
#[derive(Debug, thiserror::Error)]
#[error("the pool of 2 MiB huge pages is empty (vm.nr_hugepages): no page for this read")]
pub(crate) struct PoolEmpty;

impl PoolEmpty {
    /// Whether `e` is an empty pool's error.
    pub(crate) fn is(e: &std::io::Error) -> bool {
        e.get_ref().is_some_and(|inner| inner.is::<PoolEmpty>())
    }
}

/// Why a cache could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The store's length is more than a memfd can hold.
    #[error("{name} is {len} bytes, more than a cache can hold")]
    TooLarge {
        /// The object's name.
        name: String,
        /// The store's length.
        len: u64,
    },
    /// memfd_create or ftruncate failed.
    #[error("cannot create the memfd for {name} ({len} bytes)")]
    Memfd {
        /// The object's name.
        name: String,
        /// The object's length.
        len: u64,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The pool of 2 MiB huge pages cannot hold the object (or its memory
    /// budget).
    #[error(
        "{name} needs {needed} huge pages of 2 MiB and {available} are free \
         (vm.nr_hugepages is {pool}): raise it, e.g. \
         `echo {want} > /proc/sys/vm/nr_hugepages` as root, or map with 4 KiB pages"
    )]
    HugePages {
        /// The object's name.
        name: String,
        /// Huge pages the object (or its budget) needs.
        needed: u64,
        /// Huge pages free for it.
        available: u64,
        /// The pool's size (`vm.nr_hugepages`): 0 when the kernel has no
        /// 2 MiB pool.
        pool: u64,
        /// The pool size that would do: `pool + needed - available`.
        want: u64,
    },
    /// The alias mapping could not be created.
    #[error("cannot map the cache of {name} ({len} bytes)")]
    Alias {
        /// The object's name.
        name: String,
        /// The object's length.
        len: u64,
        /// The operating system's error.
        source: std::io::Error,
    },
}

/// The cache of one object.
pub(crate) struct Cache {
    memfd: OwnedFd,
    /// `None` for an empty object (mmap refuses length 0).
    alias: Option<MappedRegion>,
    pub(crate) states: PageStates,
    len: u64,
    pages: u64,
    size: PageSize,
}

impl Cache {
    /// A cache for an object of `len` bytes named `name`, in pages of
    /// `size`. With 2 MiB pages, the pool must have room for the object,
    /// or for `budget` bytes of it if it has a memory budget: else
    /// [`CacheError::HugePages`].
    pub(crate) fn new(
        name: &str,
        len: u64,
        size: PageSize,
        budget: Option<u64>,
    ) -> Result<Self, CacheError> {
        let page = size.bytes() as u64;
        let pages = len.div_ceil(page);
        let bytes = pages
            .checked_mul(page)
            .filter(|&b| b <= MAX_OBJECT_BYTES)
            .ok_or_else(|| CacheError::TooLarge {
                name: name.to_string(),
                len,
            })?;
        if size == PageSize::Huge && pages > 0 {
            // Under a budget, the pages in flight may pass it for a moment
            // (a page a fault waits for is always read): a few more.
            let needed = budget.map_or(pages, |b| pages.min(b.div_ceil(page) + BUDGET_HEADROOM));
            let (available, pool) = sys::huge_pages_available().unwrap_or((0, 0));
            if needed > available {
                return Err(CacheError::HugePages {
                    name: name.to_string(),
                    needed,
                    available,
                    pool,
                    want: pool + needed - available,
                });
            }
        }
        let memfd = sys::memfd_create(&memfd_name(name), bytes, size == PageSize::Huge).map_err(
            |source| CacheError::Memfd {
                name: name.to_string(),
                len,
                source,
            },
        )?;
        let alias = if bytes == 0 {
            None
        } else {
            let bytes = usize::try_from(bytes).map_err(|_| CacheError::Alias {
                name: name.to_string(),
                len,
                source: std::io::Error::from_raw_os_error(libc::EFBIG),
            })?;
            Some(
                sys::mmap_shared_rw(&memfd, bytes, 0).map_err(|source| CacheError::Alias {
                    name: name.to_string(),
                    len,
                    source,
                })?,
            )
        };
        Ok(Self {
            memfd,
            alias,
            states: PageStates::new(pages),
            len,
            pages,
            size,
        })
    }

    /// The size of the cache's pages.
    pub(crate) fn page_size(&self) -> PageSize {
        self.size
    }

    /// The object offset of page `page`'s first byte.
    pub(crate) fn offset(&self, page: ObjectPage) -> u64 {
        page.offset_in(self.size)
    }

    /// The object's pages.
    pub(crate) fn page_count(&self) -> u64 {
        self.pages
    }

    /// The bytes of `n` pages.
    pub(crate) fn bytes(&self, n: u64) -> u64 {
        n << self.size.shift()
    }

    /// The memfd that the mappings map.
    pub(crate) fn memfd(&self) -> &OwnedFd {
        &self.memfd
    }

    /// Reads object pages `pages` from `store` into the memfd, waiting.
    /// Returns the bytes read from the store.
    ///
    /// The caller must own the read of every page in the range (it won
    /// `begin_read` on each, so they are READING): no mapping maps them and no
    /// other thread writes them (page_state invariant 1).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn fill(
        &self,
        store: &dyn crate::store::Store,
        pages: Range<ObjectPage>,
    ) -> Result<usize, crate::store::StoreError> {
        let Some(target) = self.fill_target(pages) else {
            return Ok(0);
        };
        self.allocate(&target)
            .map_err(|source| crate::store::StoreError::Read {
                name: store.name().to_string(),
                offset: target.start as u64,
                len: target.data_len,
                source,
            })?;
        // SAFETY: the caller owns the reads of `pages` (this function's
        // contract), and the buffer is dropped before this returns.
        let mut buf = unsafe { self.fill_buf(&target, std::sync::Arc::new(())) };
        store.read_at(target.start as u64, buf.as_mut_slice())?;
        drop(buf);
        self.fill_finish(&target);
        Ok(target.data_len)
    }

    /// Where a read of object pages `pages` puts its bytes: `None` when
    /// there is nothing to read (the pages lie past the object's end).
    pub(crate) fn fill_target(&self, pages: Range<ObjectPage>) -> Option<FillTarget> {
        let alias = self.alias.as_ref()?;
        let start = self.offset(pages.start);
        let end_pages = self.offset(ObjectPage(pages.end.0.min(self.pages)));
        let end_data = end_pages.min(self.len);
        if start >= end_data {
            return None;
        }
        // In range: start < end_pages <= alias.len(), so these fit in usize.
        let (start, end_data, end_pages) = (start as usize, end_data as usize, end_pages as usize);
        debug_assert!(end_pages <= alias.len());
        Some(FillTarget {
            start,
            data_len: end_data - start,
            pages_len: end_pages - start,
        })
    }

    /// Allocates the memfd's pages under `target` before a read fills
    /// them: with 2 MiB pages, so that an empty pool fails the read
    /// (`ENOSPC`, reported as the read's error) instead of raising SIGBUS
    /// in the store's copy (see the module's documentation). Nothing to do
    /// with 4 KiB pages: shmem allocates as it is written.
    pub(crate) fn allocate(&self, target: &FillTarget) -> std::io::Result<()> {
        if self.size == PageSize::Base {
            return Ok(());
        }
        sys::allocate(&self.memfd, target.start as u64, target.pages_len as u64).map_err(|e| {
            if e.raw_os_error() == Some(libc::ENOSPC) {
                std::io::Error::other(PoolEmpty)
            } else {
                e
            }
        })
    }

    /// A buffer over `target`'s object bytes in the alias mapping, kept
    /// alive (with the cache) by `owner`.
    ///
    /// # Safety
    ///
    /// The caller must own the read of every page of `target` (it won
    /// `begin_read` on each: page_state invariant 1 then says no mapping
    /// maps them and no other thread touches them) until the buffer is
    /// dropped, and `owner` must keep this cache alive.
    pub(crate) unsafe fn fill_buf(
        &self,
        target: &FillTarget,
        owner: std::sync::Arc<dyn std::any::Any + Send + Sync>,
    ) -> ReadBuf {
        let alias = self
            .alias
            .as_ref()
            .map_or(std::ptr::null_mut(), |a| a.as_ptr());
        // SAFETY: pointer arithmetic in bounds: `fill_target` made `target` from
        // this cache, inside the alias mapping, which exists (it returned
        // `Some`).
        let ptr = unsafe { alias.add(target.start) };
        let ptr = std::ptr::NonNull::new(ptr).unwrap_or(std::ptr::NonNull::dangling());
        // SAFETY: [ptr, ptr + data_len) lies in the alias, valid while the
        // cache lives (kept by `owner`), and is the caller's alone until the
        // buffer is dropped (this function's contract).
        unsafe { ReadBuf::from_raw(ptr, target.data_len, owner) }
    }

    /// Ends a successful fill of `target`: the bytes past the object's end
    /// on its last page read as zero, and the alias's PTEs go.
    pub(crate) fn fill_finish(&self, target: &FillTarget) {
        let Some(alias) = &self.alias else {
            return;
        };
        // SAFETY: [start, start + pages_len) lies inside the alias mapping
        // (`fill_target`); the caller still owns the reads of its pages, and
        // the read's buffer is gone, so this slice is the only reference.
        let tail = unsafe {
            std::slice::from_raw_parts_mut(
                alias.as_ptr().add(target.start + target.data_len),
                target.pages_len - target.data_len,
            )
        };
        // The last page of the object: bytes past the end read as zero. The
        // page is normally fresh (zeroed by shmem), but may have been left by
        // a failed read.
        tail.fill(0);
        // The alias's PTEs go (the pages stay in the memfd): else every
        // cached page would be mapped, and counted in the process's RSS,
        // twice, and the alias's page tables would grow with the cache.
        let _ = sys::madvise_dontneed(alias.as_ptr() as usize + target.start, target.pages_len);
    }

    /// Drops the alias's PTEs over object pages `pages` (write-back read
    /// them through it); the pages stay in the memfd.
    pub(crate) fn unmap_alias(&self, pages: Range<ObjectPage>) {
        let Some(alias) = &self.alias else {
            return;
        };
        let start = self.offset(pages.start).min(alias.len() as u64) as usize;
        let end = self
            .offset(ObjectPage(pages.end.0.min(self.pages)))
            .min(alias.len() as u64) as usize;
        if start < end {
            let _ = sys::madvise_dontneed(alias.as_ptr() as usize + start, end - start);
        }
    }
}

impl Cache {
    /// The byte range of object pages `pages` in the object, cut at the
    /// object's end (empty for an empty object or range): what write-back
    /// hands the store.
    pub(crate) fn data_range(&self, pages: Range<ObjectPage>) -> Range<u64> {
        if self.alias.is_none() {
            return 0..0;
        }
        let start = self.offset(pages.start).min(self.len);
        let end = self
            .offset(ObjectPage(pages.end.0.min(self.pages)))
            .min(self.len)
            .max(start);
        start..end
    }

    /// Copies the bytes of object pages `pages` (cut at the object's end,
    /// [`Cache::data_range`]) out of the cache, through the alias, into
    /// `out` (replacing its contents): what write-back hands the store.
    ///
    /// The caller must hold a pin on every page of the range (so each is
    /// UPTODATE and in the memfd: page_state invariant 2). Writable
    /// mappings may store into these bytes during the copy, so the copy is
    /// made with volatile loads through a raw pointer, never through a
    /// `&[u8]` (which would promise the compiler that the bytes do not
    /// change; see "Soundness" on `crate::Mapping`). A copy torn by a
    /// concurrent write is harmless: the write-back protocol
    /// (`crate::mm::writeback`) leaves such a page DIRTY, and it is written
    /// again.
    pub(crate) fn copy_out(&self, pages: Range<ObjectPage>, out: &mut Vec<u8>) {
        out.clear();
        let Some(alias) = &self.alias else {
            return;
        };
        let range = self.data_range(pages);
        // In range: end <= len <= alias.len(), so these fit in usize.
        let (start, end) = (range.start as usize, range.end as usize);
        out.resize(end - start, 0);
        // SAFETY: [start, end) lies inside the alias mapping (data_range cuts
        // at the object's length, which the alias spans), which lives as
        // long as `self`; the pages are pinned, so no hole is punched under
        // the copy. `out` is our own buffer, disjoint from the alias.
        unsafe { volatile_copy(alias.as_ptr().add(start), out) };
    }
}

/// Copies `dst.len()` bytes from `src` with volatile loads: byte by byte
/// up to an 8-aligned address, eight bytes at a time from there, then the
/// tail byte by byte. For memory that other threads may be writing through
/// other mappings (write-back's copy here; `crate::Mapping::read_at`).
///
/// # Safety
///
/// `src..src + dst.len()` must be readable for the whole call.
pub(crate) unsafe fn volatile_copy(src: *const u8, dst: &mut [u8]) {
    const WORD: usize = std::mem::size_of::<u64>();
    let head = src.align_offset(WORD).min(dst.len());
    for (i, byte) in dst[..head].iter_mut().enumerate() {
        // SAFETY: i < dst.len(): inside the readable range.
        *byte = unsafe { std::ptr::read_volatile(src.add(i)) };
    }
    let mut done = head;
    for chunk in dst[head..].chunks_exact_mut(WORD) {
        // SAFETY: done + WORD <= dst.len(), so the word is inside the
        // readable range (the caller's promise), and it is aligned (src +
        // head is, and done - head is a multiple of WORD).
        let word = unsafe { std::ptr::read_volatile(src.add(done).cast::<u64>()) };
        chunk.copy_from_slice(&word.to_ne_bytes());
        done += WORD;
    }
    for (i, byte) in dst.iter_mut().enumerate().skip(done) {
        // SAFETY: i < dst.len(): inside the readable range.
        *byte = unsafe { std::ptr::read_volatile(src.add(i)) };
    }
}

/// The alias bytes a read of some pages fills: `data_len` bytes of object
/// data from `start`, on `pages_len` bytes of whole pages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FillTarget {
    /// The object offset (and alias offset) of the first byte.
    pub(crate) start: usize,
    /// The object's bytes in the pages.
    pub(crate) data_len: usize,
    /// The pages' bytes (the last page may pass the object's end).
    pub(crate) pages_len: usize,
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sys::PAGE_SIZE;

    #[test]
    fn memfd_names_fit_the_kernel_limit() {
        let long = format!("/{}/data.bin", "é".repeat(300));
        let name = memfd_name(&long);
        assert!(name.as_bytes().len() <= 249);
        assert!(name.to_str().unwrap().ends_with("/data.bin"));
        assert_eq!(memfd_name("a\0b").to_str().unwrap(), "faultmap:a?b");
        // The kernel accepts it.
        assert!(Cache::new(&long, 4096, PageSize::Base, None).is_ok());
    }

    #[test]
    fn volatile_copy_copies_every_byte_at_any_alignment() {
        let src: Vec<u8> = (0..100u8).collect();
        for start in 0..9 {
            for len in [0, 1, 7, 8, 9, 31, 64, 91 - start] {
                let mut dst = vec![0xEE; len];
                // SAFETY: start + len <= 100: inside `src`.
                unsafe { volatile_copy(src.as_ptr().add(start), &mut dst) };
                assert_eq!(dst, &src[start..start + len], "start {start} len {len}");
            }
        }
    }

    #[test]
    fn copy_out_cuts_at_the_object_end() {
        let len = 2 * PAGE_SIZE as u64 + 100;
        let cache = Cache::new("copy_out", len, PageSize::Base, None).unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let store = crate::MemStore::new("m", data.clone());
        let pages = ObjectPage(0)..ObjectPage(3);
        assert_eq!(cache.fill(&store, pages.clone()).unwrap(), data.len());
        let mut out = vec![1, 2, 3];
        cache.copy_out(pages.clone(), &mut out);
        assert_eq!(out, data);
        cache.copy_out(ObjectPage(1)..ObjectPage(2), &mut out);
        assert_eq!(out, &data[PAGE_SIZE..2 * PAGE_SIZE]);
        cache.copy_out(ObjectPage(3)..ObjectPage(9), &mut out);
        assert!(out.is_empty());
        assert_eq!(
            cache.data_range(ObjectPage(2)..ObjectPage(9)),
            2 * PAGE_SIZE as u64..len
        );
    }

    #[test]
    fn chunks_are_absent_when_reused() {
        // Each round dirties every word; the next round's chunks (the same
        // ones, back from the pool, or others) must all be ABSENT again.
        for _ in 0..3 {
            let states = PageStates::new(4 * CHUNK_PAGES as u64);
            for p in 0..states.pages() {
                let s = states.get_or_alloc(ObjectPage(p)).unwrap();
                assert_eq!(s.load(), Word::ABSENT, "page {p}");
                assert!(s.begin_read());
                s.finish_read(true);
            }
        }
    }

    #[test]
    fn absurd_lengths_are_refused() {
        for len in [u64::MAX, u64::MAX - 4095, 1 << 63] {
            assert!(
                matches!(
                    Cache::new("x", len, PageSize::Base, None),
                    Err(CacheError::TooLarge { .. })
                ),
                "{len}"
            );
        }
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use crate::cache::page_state::State;
    use loom::sync::Arc;
    use loom::thread;

    /// Two threads race to allocate the same chunk while a third reads it:
    /// both writers end up with the same word (one chunk is published, the
    /// loser's is freed), and the reader sees either no chunk (ABSENT) or the
    /// published, initialised one.
    #[test]
    fn chunk_publication() {
        loom::model(|| {
            let states = Arc::new(PageStates::new(4));
            let a = states.clone();
            let t1 = thread::spawn(move || {
                let s = a.get_or_alloc(ObjectPage(3)).unwrap();
                assert!(s.begin_read());
                s.finish_read(false);
            });
            let b = states.clone();
            let t2 = thread::spawn(move || {
                let w = b.load(ObjectPage(3));
                assert!(matches!(
                    w.state(),
                    State::Absent | State::Reading | State::UpToDate
                ));
            });
            let s = states.get_or_alloc(ObjectPage(2)).unwrap();
            assert_eq!(s.load().state(), State::Absent);
            t1.join().unwrap();
            t2.join().unwrap();
            assert_eq!(states.load(ObjectPage(3)).state(), State::UpToDate);
            assert!(std::ptr::eq(
                states.get(ObjectPage(2)).unwrap(),
                states.get_or_alloc(ObjectPage(2)).unwrap()
            ));
        });
    }
}
