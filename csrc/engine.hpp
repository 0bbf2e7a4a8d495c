// ckptbench native I/O engine: plain C++17, no Python headers.
//
// A call takes a list of jobs (buffer, nbytes, file, offset), cuts them into block_size chunks and
// runs the chunks on N threads with pwrite/pread. O_DIRECT is used where the directory supports it
// (probed once per directory, cached); otherwise the engine falls back to buffered I/O plus
// fdatasync and records that it did. Errors are thrown as IoError (a std::system_error carrying
// errno, the operation and the path). Every function here may block; callers release the GIL.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace ckpt {

// An I/O failure: errno + the operation that failed + the path it failed on.
class IoError : public std::system_error {
public:
    IoError(int err, std::string op, std::string path);
    const std::string &op() const noexcept { return op_; }
    const std::string &path() const noexcept { return path_; }

private:
    std::string op_;
    std::string path_;
};

// Page-aligned host memory from posix_memalign, touched once at construction (the first touch of a
// page is a fault, far slower than a copy: buffers are allocated outside timed regions and reused).
class AlignedBuffer {
public:
    AlignedBuffer(std::size_t nbytes, std::size_t alignment, bool prefault);
    ~AlignedBuffer();
    AlignedBuffer(const AlignedBuffer &) = delete;
    AlignedBuffer &operator=(const AlignedBuffer &) = delete;

    char *data() const noexcept { return data_; }
    std::size_t size() const noexcept { return size_; }
    std::size_t alignment() const noexcept { return alignment_; }

private:
    char *data_ = nullptr;
    std::size_t size_ = 0;
    std::size_t alignment_ = 0;
};

// Shared between a running call and its caller: progress counter and cooperative cancellation.
struct Control {
    std::atomic<bool> cancel{false};
    std::atomic<std::uint64_t> bytes_done{0};
};

struct Job {
    char *buf;
    std::size_t nbytes;
    std::string path;
    std::uint64_t offset;
};

enum class SyncMode { None, Fdatasync, Fsync };

// How chunks meet threads. Shared: one queue of block-size chunks in file order, every thread
// takes the next chunk (threads cooperate on one file at a time). PerFile: each thread takes the
// next whole file and streams it (fio's numjobs, DCP's per-file writers).
enum class Schedule { Shared, PerFile };

struct IoOptions {
    int threads = 1;
    std::size_t block_size = 4u << 20;
    bool direct = true;                   // request O_DIRECT (falls back where unsupported)
    SyncMode sync = SyncMode::Fdatasync;  // per file, once its last chunk is written (writes only)
    bool sync_dir = true;                 // fsync each parent directory at the end (writes only)
    bool drop_cache = true;               // reads: fdatasync + posix_fadvise(DONTNEED) before timing
    bool record_latency = true;           // keep one latency sample per chunk
    // The timeline's interval: bytes are counted in the interval (since the call's start) in which
    // their chunk completed.
    std::int64_t sample_interval_ns = 1000000000;
    // CLOCK_MONOTONIC time after which no new chunk starts (0: none); a write stopped by it still
    // syncs the files it wrote to (a run by time rather than by size).
    std::int64_t deadline_ns = 0;
    Schedule schedule = Schedule::Shared;
    // Writes on ext4: before the first block, reserve each file's range of the call's O_DIRECT blocks
    // with fallocate(2) (sizing the file to its end). ext4 runs an O_DIRECT write that extends a file
    // under the inode's exclusive lock until it completes, so threads writing one file (or calls
    // writing pieces of it side by side) take turns; into reserved blocks inside the file's size they
    // run at once. A filesystem that refuses fallocate is written as without it. Not with a deadline:
    // a write stopped early would leave reserved blocks that read as zeros without touching the device.
    bool preallocate = false;
    // Writes: called before each block is written with the end of its bytes in memory; returns once
    // they may be written (a copy-on-write staging still filling the buffer, see cow_copy.hpp).
    std::function<void(const char *end)> before_write;
    // Writes: one descriptor per file, in the order the jobs first name each file, opened (and closed) by
    // the caller. Each file is then written through a reopening of its descriptor (/proc/self/fd), the very
    // file the caller checked, never looked up by its path again; the paths serve the O_DIRECT probe, the
    // directory sync and messages. Empty: every file is opened by its path (created, never through a symlink).
    std::vector<int> fds;
};

struct ThreadStat {
    std::int64_t start_ns = 0;
    std::int64_t end_ns = 0;
    std::uint64_t bytes = 0;
    std::uint64_t ops = 0;
};

// Latency histogram buckets, log-linear like fio's completion-latency buckets: values below
// 2^kLatencySubBits nanoseconds have a bucket each; above, every power of two is cut into
// 2^kLatencySubBits equal buckets (a bucket is at most 1/8 of its value wide).
constexpr int kLatencySubBits = 3;
constexpr std::size_t kLatencyBuckets = (64 - kLatencySubBits + 1) << kLatencySubBits;

inline std::size_t latency_bucket(std::uint64_t ns) noexcept {
    constexpr std::uint64_t sub = 1u << kLatencySubBits;
    if (ns < sub) return static_cast<std::size_t>(ns);
    int msb = 63 - __builtin_clzll(ns);
    int shift = msb - kLatencySubBits;
    return (static_cast<std::size_t>(shift + 1) << kLatencySubBits) + ((ns >> shift) & (sub - 1));
}

struct IoResult {
    std::uint64_t bytes = 0;
    std::uint64_t ops = 0;
    std::int64_t start_ns = 0;  // CLOCK_MONOTONIC, first start over the call (files opened inside)
    std::int64_t end_ns = 0;    // last finish, after every requested fsync
    std::vector<ThreadStat> threads;
    std::vector<std::uint64_t> latencies_ns;  // one per chunk (or per file for metadata)
    std::int64_t interval_ns = 0;               // the timeline's interval
    std::vector<std::uint64_t> timeline_bytes;  // bytes completed in each interval since start_ns
    std::vector<std::uint64_t> latency_histogram;  // operations per latency_bucket(), kLatencyBuckets long
    bool deadline_reached = false;              // stopped by IoOptions::deadline_ns
    std::size_t files = 0;
    bool direct_requested = false;
    bool direct_used = false;
    std::string fallback_reason;  // why O_DIRECT was not used, empty if it was (or was not asked)
    SyncMode sync = SyncMode::None;
    bool cancelled = false;

    double seconds() const noexcept { return (end_ns - start_ns) * 1e-9; }
};

// True when `directory` accepts an aligned O_DIRECT write; otherwise false and the reason.
// Cached per directory for the life of the process.
std::pair<bool, std::string> probe_direct(const std::string &directory);

IoResult write_jobs(const std::vector<Job> &jobs, const IoOptions &opts, Control *control);
IoResult read_jobs(const std::vector<Job> &jobs, const IoOptions &opts, Control *control);

// A gathered write: a file's bytes taken from many places in memory where they already are (each
// tensor's own memory, no staging copy), the gaps between them written as zeros.
struct Segment {
    const char *src;        // nbytes readable bytes
    std::uint64_t offset;   // where they go in the file
    std::size_t nbytes;
};

// One file of a gathered write: `size` bytes, its segments sorted by offset, not overlapping, inside it.
// `fd` >= 0: the file is written through that descriptor (writable, not O_APPEND), which the caller
// opened and closes; `path` then only names it in errors and names its directory for `sync_dir`.
struct GatherFile {
    std::string path;
    std::vector<Segment> segments;
    std::uint64_t size = 0;
    int fd = -1;
};

// The CRC-32C of `nbytes` bytes at `offset` of the gathered write's file number `file`; the range
// lies inside one segment.
struct CrcRange {
    std::size_t file;
    std::uint64_t offset;
    std::size_t nbytes;
};

// Buffered writes (never O_DIRECT: the memory is the caller's, of any alignment) of every file, cut
// into block_size pieces of the file, each written by one pwritev from its segments (and zeros).
// Files are synced per opts.sync once their last piece is written and the directories per
// opts.sync_dir, as write_jobs does; opts.schedule, threads, control and deadline as there. Each
// range's CRC-32C is computed by the thread that writes its bytes, just before it writes them (the
// bytes are read once into the cache for both), and stored in `crcs` (one per range, in order).
// Throws std::invalid_argument for segments or ranges that break the rules above.
IoResult write_gathered(const std::vector<GatherFile> &files, const std::vector<CrcRange> &ranges,
                        const IoOptions &opts, Control *control, std::vector<std::uint32_t> &crcs);

// Small-file rate: each of `files` files is created (O_EXCL), written with `file_size` bytes,
// synced per `sync`, and closed; then the directory is fsynced. One latency sample per file.
IoResult metadata_bench(const std::string &directory, std::size_t files, std::size_t file_size,
                        int threads, SyncMode sync, Control *control);

// Best-of-`repeats` memcpy bandwidth between two fresh pre-faulted buffers, in bytes per second.
double memcpy_bandwidth(std::size_t nbytes, int repeats);

// The same between two caller-owned buffers (no allocation: freeing large buffers just before a timed
// read can slow the O_DIRECT reads that follow).
double copy_bandwidth(char *dst, const char *src, std::size_t nbytes, int repeats);

// Fill with incompressible pseudo-random bytes (xorshift64*), deterministic in `seed`.
void fill_random(char *buf, std::size_t nbytes, std::uint64_t seed);

std::int64_t now_ns() noexcept;

}  // namespace ckpt
