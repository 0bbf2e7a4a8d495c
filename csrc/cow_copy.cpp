// Copy-on-write staging with userfaultfd write-protection; see cow_copy.hpp.
//
// Once the sources are protected, any thread of the process may stop in the kernel on a write to
// them until the fault thread copies its chunk. So the fault thread must never wait for anything a
// stopped thread may hold: it allocates nothing (a thread stopped inside malloc holds its arena's
// lock), takes no lock and calls no Python. Everything it needs is built before the protection.
#include "cow_copy.hpp"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include "threads.hpp"

#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)  // Linux 6.4: protect pages never touched, too
#endif

namespace ckpt {

namespace {

constexpr std::uint64_t kEvents = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMAP;
constexpr std::uint64_t kFeatures = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_UNPOPULATED | kEvents;

std::uintptr_t page_size() {
    static const auto size = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
    return size;
}

// A userfaultfd that also handles faults taken inside the kernel (a read(2) into protected memory):
// the syscall needs CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1, /dev/userfaultfd its access.
UniqueFd open_userfaultfd(std::string *why) {
    UniqueFd fd(static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK)));
    if (fd) return fd;
    int err = errno;
    UniqueFd dev(open("/dev/userfaultfd", O_RDWR | O_CLOEXEC));
    if (dev) {
        fd.reset(ioctl(dev.get(), USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK));
        err = errno;
        if (fd) return fd;
    }
    if (why)
        *why = std::string("userfaultfd is not permitted here (") + std::strerror(err) +
               "; it needs CAP_SYS_PTRACE, vm.unprivileged_userfaultfd=1 or access to /dev/userfaultfd)";
    return {};
}

UniqueFd open_cow_fd(std::string *why) {
    UniqueFd fd = open_userfaultfd(why);
    if (!fd) return {};
    uffdio_api api{};
    api.api = UFFD_API;
    api.features = kFeatures;
    if (ioctl(fd.get(), UFFDIO_API, &api) != 0) {
        if (why)
            *why = std::string("this kernel's userfaultfd lacks write-protection of unpopulated memory or the "
                               "unmap/remove/remap events (Linux 6.4+): ") + std::strerror(errno);
        return {};
    }
    return fd;
}

std::string probe() {
    std::string why;
    if (!open_cow_fd(&why)) return why;
    char from[64] = "probe", to[64] = {0};  // a container's seccomp profile may refuse it
    iovec local{to, sizeof to}, remote{from, sizeof from};
    if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != static_cast<ssize_t>(sizeof from))
        return std::string("process_vm_readv is not permitted here: ") + std::strerror(errno);
    return {};
}

// The private anonymous mappings of this process (/proc/self/maps), sorted: the only memory a
// cow_copy protects. Writes to a shared mapping by another process would not stop in this one's
// userfaultfd; file-backed and hugetlbfs memory cannot be write-protected everywhere.
std::vector<std::pair<std::uintptr_t, std::uintptr_t>> private_anonymous_mappings() {
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> out;
    FILE *maps = std::fopen("/proc/self/maps", "re");
    if (!maps) return out;
    char line[4096];
    while (std::fgets(line, sizeof line, maps)) {
        unsigned long lo = 0, hi = 0, offset = 0, inode = 0;
        char perms[8] = {0}, dev[16] = {0};
        int path_at = 0;
        if (std::sscanf(line, "%lx-%lx %7s %lx %15s %lu %n", &lo, &hi, perms, &offset, dev, &inode, &path_at) < 6)
            continue;
        const char *path = line + path_at;
        bool anonymous = inode == 0 && (*path == '\n' || *path == '\0' || std::strncmp(path, "[heap]", 6) == 0 ||
                                        std::strncmp(path, "[anon:", 6) == 0);
        if (perms[3] == 'p' && perms[1] == 'w' && anonymous) {
            if (!out.empty() && out.back().second == lo)
                out.back().second = hi;
            else
                out.emplace_back(lo, hi);
        }
    }
    std::fclose(maps);
    return out;
}

bool inside(const std::vector<std::pair<std::uintptr_t, std::uintptr_t>> &mappings, std::uintptr_t lo,
            std::uintptr_t hi) {
    auto it = std::upper_bound(mappings.begin(), mappings.end(), lo,
                               [](std::uintptr_t a, const auto &m) { return a < m.first; });
    return it != mappings.begin() && lo >= std::prev(it)->first && hi <= std::prev(it)->second;
}

bool overlaps(std::uintptr_t a0, std::uintptr_t a1, std::uintptr_t b0, std::uintptr_t b1) {
    return a0 < b1 && b0 < a1;
}

}  // namespace

const std::string &cow_unavailable() {
    static const std::string why = probe();
    return why;
}

CowCopy::CowCopy(std::vector<CopyJob> jobs, int threads, std::size_t chunk_bytes, std::size_t min_region_bytes,
                   std::size_t max_regions) {
    if (!cow_unavailable().empty()) throw std::runtime_error(cow_unavailable());
    const std::uintptr_t page = page_size();
    chunk_bytes = std::max<std::size_t>(page, chunk_bytes / page * page);
    threads = std::max(1, threads);
    pid_ = getpid();

    // Everything that allocates comes first: once a page is registered, a thread stopped in the
    // kernel on it (or on an unmap of it) waits for the fault thread, and nothing may fail between.
    // The destination span: never protected (the copies write there), nor anything sharing its pages.
    std::uintptr_t dst_lo = UINTPTR_MAX, dst_hi = 0;
    std::vector<CopyJob> sources;
    sources.reserve(jobs.size());
    for (const auto &j : jobs) {
        if (j.zero_after) std::memset(j.dst + j.nbytes, 0, j.zero_after);
        if (!j.nbytes) continue;
        auto d = reinterpret_cast<std::uintptr_t>(j.dst);
        dst_lo = std::min(dst_lo, d / page * page);
        dst_hi = std::max(dst_hi, (d + j.nbytes + page - 1) / page * page);
        sources.push_back(j);
    }
    std::sort(sources.begin(), sources.end(), [](const CopyJob &a, const CopyJob &b) { return a.src < b.src; });

    // Regions: the pages under the sources, merged where they touch. Protected: those inside private
    // anonymous memory, apart from the destination, of at least min_region_bytes (each costs up to
    // two memory mappings of the process's vm.max_map_count), at most max_regions of the largest.
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> regions;
    for (const auto &j : sources) {
        auto s = reinterpret_cast<std::uintptr_t>(j.src);
        std::uintptr_t lo = s / page * page, hi = (s + j.nbytes + page - 1) / page * page;
        if (!regions.empty() && lo <= regions.back().second)
            regions.back().second = std::max(regions.back().second, hi);
        else
            regions.emplace_back(lo, hi);
    }
    const auto mappings = private_anonymous_mappings();
    for (const auto &[lo, hi] : regions)
        if (hi - lo >= min_region_bytes && !overlaps(lo, hi, dst_lo, dst_hi) && inside(mappings, lo, hi))
            regions_.emplace_back(lo, hi);
    if (regions_.size() > max_regions) {
        std::stable_sort(regions_.begin(), regions_.end(),
                         [](const auto &a, const auto &b) { return a.second - a.first > b.second - b.first; });
        regions_.resize(max_regions);
        std::sort(regions_.begin(), regions_.end());
    }

    // Chunks of those regions (aligned in the address space), and their pieces of each job.
    for (const auto &[lo, hi] : regions_)
        for (std::uintptr_t c = lo; c < hi;) {
            std::uintptr_t end = std::min<std::uintptr_t>(hi, (c / chunk_bytes + 1) * chunk_bytes);
            chunks_.push_back({c, end, 0, 0});
            c = end;
        }
    std::vector<std::pair<std::size_t, Piece>> pieces;
    std::vector<CopyJob> now;
    for (const auto &j : sources) {
        auto s = reinterpret_cast<std::uintptr_t>(j.src), e = s + j.nbytes;
        std::size_t c = chunk_of(s);
        if (c == SIZE_MAX) {
            now.push_back(j);
            stats_.copied_at_start += j.nbytes;
            continue;
        }
        for (; c < chunks_.size() && chunks_[c].start < e; ++c) {
            std::uintptr_t a = std::max(s, chunks_[c].start), b = std::min(e, chunks_[c].end);
            pieces.emplace_back(c, Piece{reinterpret_cast<const char *>(a), j.dst + (a - s), b - a});
        }
    }
    std::stable_sort(pieces.begin(), pieces.end(), [](const auto &a, const auto &b) { return a.first < b.first; });
    pieces_.reserve(pieces.size());
    for (std::size_t i = 0, c = 0; c < chunks_.size(); ++c) {
        chunks_[c].first = i;
        while (i < pieces.size() && pieces[i].first == c) pieces_.push_back(pieces[i++].second);
        chunks_[c].last = i;
    }
    lowest_dst_.assign(chunks_.size(), UINTPTR_MAX);
    for (std::size_t c = 0; c < chunks_.size(); ++c)
        for (std::size_t p = chunks_[c].first; p < chunks_[c].last; ++p)
            lowest_dst_[c] = std::min(lowest_dst_[c], reinterpret_cast<std::uintptr_t>(pieces_[p].dst));
    order_.resize(chunks_.size());
    for (std::size_t c = 0; c < chunks_.size(); ++c) order_[c] = c;
    std::stable_sort(order_.begin(), order_.end(),
                     [this](std::size_t a, std::size_t b) { return lowest_dst_[a] < lowest_dst_[b]; });
    stats_.chunks = chunks_.size();
    workers_ = static_cast<std::size_t>(threads) + 1;
    copiers_.reserve(static_cast<std::size_t>(threads));
    std::size_t states_at = (sizeof(Shared) + 63) / 64 * 64;
    std::size_t scratch_at = (states_at + chunks_.size() + 63) / 64 * 64;
    mapping_ = Mapping(scratch_at + workers_ * 2 * IOV_MAX * sizeof(iovec));
    shared_.reset(new (mapping_.data()) Shared());
    state_ = reinterpret_cast<std::atomic<std::uint8_t> *>(mapping_.data() + states_at);
    for (std::size_t c = 0; c < chunks_.size(); ++c) new (&state_[c]) std::atomic<std::uint8_t>(Pending);
    scratch_ = reinterpret_cast<iovec *>(mapping_.data() + scratch_at);
    shared_->remaining.store(chunks_.size());

    // Nothing is registered yet: a failure here leaves no trace (the members release what was taken).
    if (!now.empty()) parallel_copy(now, threads);
    std::string why;
    uffd_ = open_cow_fd(&why);
    if (!uffd_) throw std::runtime_error(why);
    stop_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!stop_fd_) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
    {
        AsyncSignalsBlocked blocked;
        fault_thread_ = std::thread([this] { fault_loop(); });  // before any page is registered
    }

    // From here nothing allocates or throws. A region that cannot be registered (hugetlbfs, one
    // another userfaultfd holds) is copied now.
    for (std::size_t r = 0; r < regions_.size(); ++r) {
        auto [lo, hi] = regions_[r];
        uffdio_register reg{};
        reg.range = {lo, hi - lo};
        reg.mode = UFFDIO_REGISTER_MODE_WP;
        bool ok = ioctl(uffd_.get(), UFFDIO_REGISTER, &reg) == 0;
        if (ok) {
            uffdio_writeprotect wp{};
            wp.range = {lo, hi - lo};
            wp.mode = UFFDIO_WRITEPROTECT_MODE_WP;
            if (ioctl(uffd_.get(), UFFDIO_WRITEPROTECT, &wp) == 0) {
                stats_.protected_bytes += hi - lo;
                ++stats_.regions;
                continue;
            }
            uffdio_range range{lo, hi - lo};
            ioctl(uffd_.get(), UFFDIO_UNREGISTER, &range);
        }
        regions_[r].second = regions_[r].first;  // not registered: nothing to unregister at the end
        for (std::size_t c = chunk_of(lo); c < chunks_.size() && chunks_[c].start < hi; ++c) {
            claim_and_copy(c, 0);
            stats_.copied_at_start += chunks_[c].end - chunks_[c].start;
        }
    }
    AsyncSignalsBlocked blocked;
    int started = 0;
    try {
        for (; started < threads; ++started)
            copiers_.emplace_back([this, started] { copier(static_cast<std::size_t>(started)); });
    } catch (...) {
        copier(static_cast<std::size_t>(started));  // no more threads: this one copies (its scratch is free)
    }
}

CowCopy::~CowCopy() {
    if (getpid() != pid_) {  // a forked child: the threads are the parent's; forget them unjoined
        for (auto &t : copiers_) new (&t) std::thread();
        new (&fault_thread_) std::thread();
        // The descriptors still held were inherited while the parent's cow_copy ran (finish() released
        // them otherwise): the members close them. The shared pages are left as they are: their mutex
        // and condition variable may be the parent's threads', which do not exist here.
        shared_.release();
        mapping_.release();
        return;
    }
    try {
        finish();
    } catch (...) {
    }
}

std::size_t CowCopy::chunk_of(std::uintptr_t address) const noexcept {
    auto it = std::upper_bound(chunks_.begin(), chunks_.end(), address,
                               [](std::uintptr_t a, const Chunk &c) { return a < c.start; });
    if (it == chunks_.begin()) return SIZE_MAX;
    --it;
    return address < it->end ? static_cast<std::size_t>(it - chunks_.begin()) : SIZE_MAX;
}

void CowCopy::fail(const char *what, std::uintptr_t start, std::uintptr_t end) noexcept {
    if (shared_->failed.exchange(true)) return;
    std::snprintf(shared_->failure, sizeof shared_->failure, "%s [%#zx, %#zx) while the save was copying it", what,
                  static_cast<std::size_t>(start), static_cast<std::size_t>(end));
}

void CowCopy::copy_chunk(std::size_t index, std::size_t worker) {
    const Chunk &chunk = chunks_[index];
    iovec *local = scratch_ + worker * 2 * IOV_MAX, *remote = local + IOV_MAX;
    for (std::size_t p = chunk.first; p < chunk.last && !shared_->failed.load(std::memory_order_relaxed);) {
        std::size_t n = 0, want = 0;
        for (; p < chunk.last && n < IOV_MAX; ++p, ++n) {
            local[n] = {pieces_[p].dst, pieces_[p].nbytes};
            remote[n] = {const_cast<char *>(pieces_[p].src), pieces_[p].nbytes};
            want += pieces_[p].nbytes;
        }
        ssize_t got = process_vm_readv(pid_, local, n, remote, n, 0);
        if (got != static_cast<ssize_t>(want)) fail("could not read memory", chunk.start, chunk.end);
    }
    uffdio_writeprotect wp{};  // lift the protection and wake the threads waiting on the chunk
    wp.range = {chunk.start, chunk.end - chunk.start};
    wp.mode = 0;
    ioctl(uffd_.get(), UFFDIO_WRITEPROTECT, &wp);
    state_[index].store(Done);
    if (shared_->remaining.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> lock(shared_->done_mutex);
        shared_->done_cv.notify_all();
    }
}

bool CowCopy::claim_and_copy(std::size_t index, std::size_t worker) {
    std::uint8_t expected = Pending;
    if (!state_[index].compare_exchange_strong(expected, Busy)) return false;
    copy_chunk(index, worker);
    return true;
}

void CowCopy::copier(std::size_t worker) {
    for (std::size_t i = shared_->next.fetch_add(1); i < order_.size(); i = shared_->next.fetch_add(1))
        claim_and_copy(order_[i], worker);
}

std::uintptr_t CowCopy::copied_below() noexcept {
    std::size_t seen = shared_->copied.load(), i = seen;
    while (i < order_.size() && state_[order_[i]].load() == Done) ++i;
    while (seen < i && !shared_->copied.compare_exchange_weak(seen, i)) {
    }
    // Every chunk not yet copied writes at or above its lowest destination, and those come in order.
    return i < order_.size() ? lowest_dst_[order_[i]] : UINTPTR_MAX;
}

bool CowCopy::wait_copied(const char *end) noexcept {
    const auto until = reinterpret_cast<std::uintptr_t>(end);
    for (long wait_ns = 20000;; wait_ns = std::min(wait_ns * 2, 1000000L)) {  // up to 1 ms between looks
        if (until <= copied_below()) return true;
        if (shared_->failed.load()) return false;
        timespec pause{0, wait_ns};
        nanosleep(&pause, nullptr);
    }
}

void CowCopy::fault_loop() {
    pollfd fds[2] = {{uffd_.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
    for (;;) {  // until told to stop: a thread stopped on a protected page has no one else
        if (poll(fds, 2, -1) < 0) {
            if (errno != EINTR) {
                fail("could not poll the userfaultfd of", 0, 0);
                timespec pause{0, 1000000};
                nanosleep(&pause, nullptr);
            }
            continue;
        }
        handle_messages();
        if (fds[1].revents & POLLIN) return;
    }
}

void CowCopy::handle_messages() {
    const std::size_t worker = workers_ - 1;
    uffd_msg msgs[16];
    for (;;) {
        ssize_t n = read(uffd_.get(), msgs, sizeof msgs);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN) fail("could not read the userfaultfd of", 0, 0);
            return;
        }
        for (std::size_t i = 0; i < static_cast<std::size_t>(n) / sizeof(uffd_msg); ++i) {
            const uffd_msg &m = msgs[i];
            std::uintptr_t lo = 0, hi = 0;
            const char *what = nullptr;
            if (m.event == UFFD_EVENT_PAGEFAULT) {
                auto address = static_cast<std::uintptr_t>(m.arg.pagefault.address);
                std::size_t c = chunk_of(address);
                uffdio_range range{address / page_size() * page_size(), page_size()};
                if (c == SIZE_MAX) {  // outside every chunk (none expected): unprotect the page, go on
                    uffdio_writeprotect wp{range, 0};
                    ioctl(uffd_.get(), UFFDIO_WRITEPROTECT, &wp);
                    continue;
                }
                shared_->faults.fetch_add(1, std::memory_order_relaxed);
                if (!claim_and_copy(c, worker))  // a copier has it: the copy is short, then wake
                    while (state_[c].load() != Done) sched_yield();
                range = {chunks_[c].start, chunks_[c].end - chunks_[c].start};
                ioctl(uffd_.get(), UFFDIO_WAKE, &range);  // in case the copy's unprotect woke no one
                continue;
            }
            if (m.event == UFFD_EVENT_REMOVE) {
                lo = m.arg.remove.start, hi = m.arg.remove.end, what = "memory was released (madvise)";
            } else if (m.event == UFFD_EVENT_UNMAP) {
                lo = m.arg.remove.start, hi = m.arg.remove.end, what = "memory was unmapped (freed)";
            } else if (m.event == UFFD_EVENT_REMAP) {
                lo = m.arg.remap.from, hi = lo + m.arg.remap.len, what = "memory was moved (mremap)";
            } else {
                continue;
            }
            // Harmless where every chunk it touches was copied already; else the copy may be torn.
            for (std::size_t c = 0; c < chunks_.size(); ++c)
                if (overlaps(lo, hi, chunks_[c].start, chunks_[c].end) && state_[c].load() != Done) {
                    fail(what, lo, hi);
                    break;
                }
        }
    }
}

void CowCopy::unregister_all() noexcept {
    for (const auto &[lo, hi] : regions_) {
        if (lo == hi) continue;
        uffdio_range range{lo, hi - lo};
        if (ioctl(uffd_.get(), UFFDIO_UNREGISTER, &range) == 0) continue;
        // Part of it was unmapped and mapped anew (a failed cow_copy): page by page, what is left.
        for (std::uintptr_t p = lo; p < hi; p += page_size()) {
            uffdio_range one{p, page_size()};
            ioctl(uffd_.get(), UFFDIO_UNREGISTER, &one);
        }
    }
}

void CowCopy::finish() {
    if (getpid() != pid_)  // a forked child: its copy of this has no threads and a partial destination
        throw std::runtime_error("a cow_copy cannot be finished in a process forked from the one that took it");
    std::lock_guard<std::mutex> once(finish_mutex_);
    if (!finished_) {
        {
            std::unique_lock<std::mutex> lock(shared_->done_mutex);
            shared_->done_cv.wait(lock, [this] { return shared_->remaining.load() == 0; });
        }
        for (auto &t : copiers_) t.join();
        copiers_.clear();
        unregister_all();  // no event after this; the fault thread drains those queued, then stops
        std::uint64_t one = 1;
        if (write(stop_fd_.get(), &one, sizeof one) != sizeof one) fail("could not stop the fault thread of", 0, 0);
        if (fault_thread_.joinable()) fault_thread_.join();
        stop_fd_.reset();
        uffd_.reset();
        stats_.faults = shared_->faults.load();
        finished_ = true;
    }
    if (shared_->failed.load()) throw std::runtime_error(shared_->failure);
}

CowCopyStats CowCopy::stats() const {
    CowCopyStats s = stats_;
    s.faults = shared_->faults.load();
    return s;
}

}  // namespace ckpt
