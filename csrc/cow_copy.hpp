// Copy-on-write staging: a consistent copy of host memory that the caller may write to at once.
//
// An async save blocks its caller only while staging, and staging host tensors is a memcpy of the
// whole checkpoint. A CowCopy write-protects the source pages instead (Linux
// userfaultfd, UFFDIO_WRITEPROTECT, as QEMU's background snapshots do) and copies them into the
// destination on background threads. A write to a page not yet copied stops the writing thread in
// the kernel; the cow_copy's fault thread copies that page's chunk first, lifts the protection and
// the write goes on. The caller is blocked only while the pages are protected (milliseconds).
//
// Copies read the sources with process_vm_readv, which fails (EFAULT) where memory was unmapped
// instead of crashing the process; unmaps, removals (MADV_DONTNEED) and moves (mremap) of protected
// memory are reported by the kernel, and finish() then fails rather than return a torn copy.
// Sources that cannot be protected (shared, file-backed or hugetlbfs memory, memory another
// userfaultfd holds) are copied before the constructor returns.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/uio.h>

#include "copy.hpp"
#include "resources.hpp"

namespace ckpt {

// Why copy-on-write copies cannot be taken in this process ("" when they can). Probed once: the userfaultfd
// syscall or /dev/userfaultfd, write-protection of unpopulated anonymous memory (Linux 6.4+), the
// unmap/remove/remap events, and process_vm_readv.
const std::string &cow_unavailable();

struct CowCopyStats {
    std::size_t protected_bytes = 0;  // source pages write-protected, copied in the background
    std::size_t copied_at_start = 0;  // source bytes that could not be protected, copied before returning
    std::size_t chunks = 0;
    std::size_t faults = 0;           // writes that waited for their chunk to be copied
    std::size_t regions = 0;          // protected address ranges
};

class CowCopy {
public:
    // Protects the sources of `jobs` (zeroes each job's padding now) and starts copying on `threads`
    // threads in chunks of `chunk_bytes`. Throws std::runtime_error when copy-on-write copies are unavailable.
    // Regions (the sources' pages, merged where they touch) under `min_region_bytes` are copied
    // before returning, as are all but the `max_regions` largest: each protected region may cost the
    // process two of its memory mappings (vm.max_map_count).
    CowCopy(std::vector<CopyJob> jobs, int threads, std::size_t chunk_bytes, std::size_t min_region_bytes = 256 << 10,
             std::size_t max_regions = 4096);
    ~CowCopy();
    CowCopy(const CowCopy &) = delete;
    CowCopy &operator=(const CowCopy &) = delete;

    // Waits until every byte is copied and the protection is gone; throws std::runtime_error when
    // the sources changed under it (freed, moved) or could not be read. Idempotent, thread-safe.
    void finish();
    // Waits until every destination byte below `end` is copied (chunks are copied in destination
    // order, so a writer of the destination can follow the copy); false if the cow_copy failed.
    bool wait_copied(const char *end) noexcept;
    bool done() const noexcept { return shared_->remaining.load() == 0; }
    CowCopyStats stats() const;

private:
    struct Piece {
        const char *src;
        char *dst;
        std::size_t nbytes;
    };
    struct Chunk {
        std::uintptr_t start, end;    // page-aligned source addresses
        std::size_t first, last;      // its pieces: pieces_[first, last)
    };
    enum : std::uint8_t { Pending, Busy, Done };

    void copy_chunk(std::size_t index, std::size_t worker);
    bool claim_and_copy(std::size_t index, std::size_t worker);
    void copier(std::size_t worker);
    void fault_loop();
    void handle_messages();
    std::size_t chunk_of(std::uintptr_t address) const noexcept;
    std::uintptr_t copied_below() noexcept;
    void fail(const char *what, std::uintptr_t start, std::uintptr_t end) noexcept;
    void unregister_all() noexcept;

    // What the copiers and the fault thread write, in pages of its own (mmap): never among the
    // protected pages, which may hold anything of the heap, this object included.
    struct Shared {
        std::atomic<std::size_t> next{0};
        std::atomic<std::size_t> copied{0};  // order_[0, copied) are all Done
        std::atomic<std::size_t> remaining{0};
        std::atomic<std::size_t> faults{0};
        std::atomic<bool> failed{false};
        char failure[256] = {0};  // written once, by whoever failed first
        std::mutex done_mutex;
        std::condition_variable done_cv;
    };

    // Destroys the Shared in place (its pages belong to mapping_).
    struct DestroyShared {
        void operator()(Shared *shared) const noexcept { shared->~Shared(); }
    };

    UniqueFd uffd_;
    int pid_ = 0;
    UniqueFd stop_fd_;
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> regions_;  // registered [start, end)
    std::vector<Chunk> chunks_;
    std::vector<Piece> pieces_;
    std::vector<std::size_t> order_;         // chunks by the lowest destination address they copy to
    std::vector<std::uintptr_t> lowest_dst_;  // per chunk
    Mapping mapping_;  // Shared, then one state per chunk, then per worker 2 x IOV_MAX iovecs
    std::unique_ptr<Shared, DestroyShared> shared_;
    std::atomic<std::uint8_t> *state_ = nullptr;
    iovec *scratch_ = nullptr;  // workers: the copiers, then the fault thread
    std::size_t workers_ = 0;
    std::vector<std::thread> copiers_;
    std::thread fault_thread_;
    std::mutex finish_mutex_;
    bool finished_ = false;
    CowCopyStats stats_;
};

}  // namespace ckpt
