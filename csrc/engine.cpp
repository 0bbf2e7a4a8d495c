#include "engine.hpp"
#include "checksum.hpp"
#include "resources.hpp"
#include "threads.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>
#include <unordered_map>

namespace ckpt {

namespace {

// A syscall interrupted by a signal handler (EINTR: Python installs its handlers without SA_RESTART,
// and the engine's own workers block signals, so they land on the calling thread) is retried.
template <typename Call>
int retry_eintr(Call call) {
    int rc;
    do rc = call();
    while (rc == -1 && errno == EINTR);
    return rc;
}

constexpr std::size_t kDirectAlign = 4096;

enum class Kind { Write, Read };

bool is_aligned(std::uint64_t value) { return value % kDirectAlign == 0; }

std::string parent_dir(const std::string &path) {
    auto pos = path.rfind('/');
    if (pos == std::string::npos) return ".";
    if (pos == 0) return "/";
    return path.substr(0, pos);
}

void sync_fd(int fd, SyncMode mode, const std::string &path) {
    if (mode == SyncMode::None) return;
    int rc = retry_eintr([&] { return mode == SyncMode::Fsync ? ::fsync(fd) : ::fdatasync(fd); });
    if (rc != 0) throw IoError(errno, mode == SyncMode::Fsync ? "fsync" : "fdatasync", path);
}

// Opens `path` with open(2)'s `flags` and `mode`, retrying EINTR; throws IoError when it fails.
UniqueFd open_file(const std::string &path, int flags, mode_t mode = 0) {
    UniqueFd fd(retry_eintr([&] { return ::open(path.c_str(), flags, mode); }));
    if (!fd) throw IoError(errno, "open", path);
    return fd;
}

// Checks that the caller's descriptor `fd` for the file `path` is open for writing, without O_APPEND nor
// any of the `refused` flags (O_DIRECT where the file is written through that very descriptor).
void check_given_fd(int fd, int refused, const std::string &path) {
    int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0) throw IoError(errno, "fcntl", path);
    if ((flags & O_ACCMODE) == O_RDONLY || (flags & (O_APPEND | refused)))
        throw std::invalid_argument("the descriptor given for " + path + " must be open for writing, without O_APPEND" +
                                    (refused & O_DIRECT ? " or O_DIRECT" : ""));
}

// A new open file description of what the caller's descriptor `fd` holds, for writing, with `extra` flags
// (O_DIRECT needs a description of its own): through /proc/self/fd, so the file is the one the caller
// opened and checked, whatever its name now names. Checked to be that file. A failure (too many open
// files, O_DIRECT refused) names the file by `path`, not by the link it was reopened through.
UniqueFd reopen_for_writing(int fd, int extra, const std::string &path) {
    std::string link = "/proc/self/fd/" + std::to_string(fd);
    UniqueFd reopened(retry_eintr([&] { return ::open(link.c_str(), O_WRONLY | O_CLOEXEC | extra); }));
    if (!reopened) throw IoError(errno, "open", path);
    struct stat given {}, got {};
    if (::fstat(fd, &given) != 0 || ::fstat(reopened.get(), &got) != 0) throw IoError(errno, "fstat", path);
    if (given.st_dev != got.st_dev || given.st_ino != got.st_ino || !S_ISREG(got.st_mode))
        throw IoError(EXDEV, "reopen (not the file the descriptor holds)", path);
    return reopened;
}

void sync_directory(const std::string &dir) {
    UniqueFd fd = open_file(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (retry_eintr([&] { return ::fsync(fd.get()); }) != 0) {
        int err = errno;
        // Some filesystems (FUSE, tmpfs variants) do not implement fsync on directories.
        if (err == EINVAL || err == EROFS || err == ENOTSUP) return;
        throw IoError(err, "fsync", dir);
    }
}

// Move exactly len bytes, retrying short transfers and EINTR.
void transfer(Kind kind, int fd, char *buf, std::size_t len, std::uint64_t offset, const std::string &path) {
    std::size_t done = 0;
    while (done < len) {
        ssize_t n = kind == Kind::Write
                        ? ::pwrite(fd, buf + done, len - done, static_cast<off_t>(offset + done))
                        : ::pread(fd, buf + done, len - done, static_cast<off_t>(offset + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            throw IoError(errno, kind == Kind::Write ? "pwrite" : "pread", path);
        }
        if (n == 0) {
            throw IoError(kind == Kind::Read ? ENODATA : EIO,
                          kind == Kind::Read ? "pread (file shorter than expected)" : "pwrite (wrote nothing)", path);
        }
        done += static_cast<std::size_t>(n);
    }
}

// The zeros a gathered write writes between its segments (alignment padding, each gap shorter than a
// page in a checkpoint's shards; longer gaps take several vectors).
char kZeros[64u << 10] = {};

// The most vectors one pwritev takes (IOV_MAX on Linux).
constexpr std::size_t kMaxVectors = 1024;

// Write all of `iov` at `offset`, retrying short writes and EINTR, at most kMaxVectors per call.
void pwritev_all(int fd, std::vector<iovec> &iov, std::uint64_t offset, const std::string &path) {
    std::size_t first = 0;
    while (first < iov.size() && iov[first].iov_len == 0) ++first;
    while (first < iov.size()) {
        int count = static_cast<int>(std::min(iov.size() - first, kMaxVectors));
        ssize_t n = ::pwritev(fd, iov.data() + first, count, static_cast<off_t>(offset));
        if (n < 0) {
            if (errno == EINTR) continue;
            throw IoError(errno, "pwritev", path);
        }
        if (n == 0) throw IoError(EIO, "pwritev (wrote nothing)", path);
        offset += static_cast<std::uint64_t>(n);
        auto left = static_cast<std::size_t>(n);
        while (first < iov.size() && left >= iov[first].iov_len) left -= iov[first++].iov_len;
        if (left) {
            iov[first].iov_base = static_cast<char *>(iov[first].iov_base) + left;
            iov[first].iov_len -= left;
        }
        while (first < iov.size() && iov[first].iov_len == 0) ++first;
    }
}

// What one worker records about its operations: latency samples (when asked), a latency
// histogram and the bytes completed per timeline interval. Kept per worker and merged at the end,
// so recording costs a clock read and a few increments per chunk, no lock and no shared line.
struct WorkerLog {
    std::int64_t start_ns = 0;     // the call's start: interval 0 begins here
    std::int64_t interval_ns = 1;  // the timeline's interval
    std::uint64_t ops = 0;
    std::vector<std::uint64_t> latencies;
    std::vector<std::uint64_t> histogram;
    std::vector<std::uint64_t> timeline;

    // One operation that started at t0, ended at t1 and moved `bytes`.
    void record(std::int64_t t0, std::int64_t t1, std::uint64_t bytes, bool keep_latency) {
        auto latency = static_cast<std::uint64_t>(t1 - t0);
        if (keep_latency) latencies.push_back(latency);
        ++histogram[latency_bucket(latency)];
        auto slot = static_cast<std::size_t>(std::max<std::int64_t>(t1 - start_ns, 0) / interval_ns);
        if (slot >= timeline.size()) timeline.resize(slot + 1, 0);
        timeline[slot] += bytes;
        ++ops;
    }
};

// parallel_for with one ThreadStat and one WorkerLog per worker; cancellation (the Control's flag)
// and the deadline stop the workers between items.
struct WorkerPool {
    std::vector<ThreadStat> stats;
    std::vector<WorkerLog> logs;
    bool cancelled = false;
    std::atomic<bool> deadline_reached{false};  // set by any worker that saw the deadline pass

    // work(item, log) does one item, records each operation it timed in the log (or none), and
    // returns the bytes it moved.
    using Work = std::function<std::uint64_t(std::size_t, WorkerLog &)>;

    void run(int nthreads, std::size_t items, Control *control, std::int64_t start_ns, std::int64_t interval_ns,
             std::int64_t deadline_ns, const Work &work) {
        const std::size_t workers = worker_count(items, nthreads);
        stats.assign(workers, ThreadStat{});
        WorkerLog blank;
        blank.start_ns = start_ns;
        blank.interval_ns = std::max<std::int64_t>(interval_ns, 1);
        blank.histogram.assign(kLatencyBuckets, 0);
        logs.assign(workers, blank);
        std::size_t ran = parallel_for(
            items, nthreads,
            [&](std::size_t worker, std::size_t i) {
                auto &log = logs[worker];
                std::uint64_t before = log.ops;
                stats[worker].bytes += work(i, log);
                stats[worker].ops += log.ops - before;
            },
            [&] {
                if (control && control->cancel.load(std::memory_order_relaxed)) return true;
                if (deadline_ns > 0 && now_ns() >= deadline_ns) {
                    deadline_reached.store(true, std::memory_order_relaxed);
                    return true;
                }
                return false;
            },
            [&](std::size_t worker, auto &loop) {
                stats[worker].start_ns = now_ns();
                loop();
                stats[worker].end_ns = now_ns();
            });
        stats.resize(ran);
        logs.resize(ran);
        cancelled = control && control->cancel.load();
    }

    void fill(IoResult &r, bool keep_latencies) {
        for (auto &st : stats) {
            r.bytes += st.bytes;
            r.ops += st.ops;
        }
        r.threads = stats;
        r.latency_histogram.assign(kLatencyBuckets, 0);
        for (auto &log : logs) {
            if (keep_latencies) r.latencies_ns.insert(r.latencies_ns.end(), log.latencies.begin(), log.latencies.end());
            for (std::size_t b = 0; b < kLatencyBuckets; ++b) r.latency_histogram[b] += log.histogram[b];
            if (log.timeline.size() > r.timeline_bytes.size()) r.timeline_bytes.resize(log.timeline.size(), 0);
            for (std::size_t t = 0; t < log.timeline.size(); ++t) r.timeline_bytes[t] += log.timeline[t];
        }
        r.cancelled = cancelled;
        r.deadline_reached = deadline_reached.load();
    }
};

// One timed operation: run op(), record it in the worker's log, count its bytes as progress.
template <typename Op>
std::uint64_t timed(WorkerLog &log, bool keep_latency, Control *control, std::uint64_t bytes, Op op) {
    std::int64_t t0 = now_ns();
    op();
    log.record(t0, now_ns(), bytes, keep_latency);
    if (control) control->bytes_done.fetch_add(bytes, std::memory_order_relaxed);
    return bytes;
}

struct FileState {
    std::string path;
    UniqueFd fd_direct;
    UniqueFd fd_buffered;
    bool borrowed = false;  // fd_buffered is the caller's: never closed here
    bool wants_direct = false;
    bool wants_buffered = false;
    std::size_t chunks = 0;
    std::atomic<std::size_t> remaining{0};
    // The file's range written O_DIRECT by this call (reserved first where IoOptions::preallocate says).
    std::uint64_t direct_begin = UINT64_MAX;
    std::uint64_t direct_end = 0;

    FileState() = default;
    FileState(const FileState &) = delete;
    FileState &operator=(const FileState &) = delete;
    ~FileState() { close(); }
    void close() noexcept {
        if (borrowed) fd_buffered.release();
        fd_direct.reset();
        fd_buffered.reset();
    }
};

// Reserves the bytes [begin, end) of an ext4 file open at `fd` (IoOptions::preallocate), from the
// file's end where the range starts beyond it: a hole left below would make the piece written there
// an allocating write, again under the exclusive lock. Nothing to do where the range is inside the
// file already or the filesystem is not ext4; a refusal that only says fallocate is unsupported
// leaves the file as it is (the write allocates its blocks as it goes).
void reserve_range(int fd, std::uint64_t begin, std::uint64_t end, const std::string &path) {
    struct statfs fs {};
    if (::fstatfs(fd, &fs) != 0 || fs.f_type != EXT4_SUPER_MAGIC) return;
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw IoError(errno, "fstat", path);
    auto size = static_cast<std::uint64_t>(st.st_size);
    if (end <= size) return;
    std::uint64_t from = std::min(begin, size);
    int rc = retry_eintr([&] { return ::fallocate(fd, 0, static_cast<off_t>(from), static_cast<off_t>(end - from)); });
    if (rc != 0 && errno != EOPNOTSUPP && errno != ENOSYS && errno != EINVAL) throw IoError(errno, "fallocate", path);
}

struct Chunk {
    FileState *file;
    char *buf;
    std::size_t len;
    std::uint64_t offset;
    bool direct;
};

// O_DIRECT support for reading an existing file: open it with O_DIRECT and read one aligned block.
std::pair<bool, std::string> probe_direct_read(const std::string &path) {
    UniqueFd fd(retry_eintr([&] { return ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC); }));
    if (!fd) {
        int err = errno;
        if (err == EINVAL) return {false, "open(O_DIRECT) is not supported: " + std::string(std::strerror(err))};
        throw IoError(err, "open", path);
    }
    AlignedBuffer block(kDirectAlign, kDirectAlign, false);
    ssize_t n = ::pread(fd.get(), block.data(), kDirectAlign, 0);
    int err = errno;
    if (n < 0 && err == EINVAL) return {false, "pread(O_DIRECT) is not supported: " + std::string(std::strerror(err))};
    return {true, ""};
}

// Runs do_chunk(i, log) for each of `chunks` chunks on the pool: with Schedule::Shared from one queue,
// every thread taking the next chunk; with Schedule::PerFile each of the `files` files (chunk i's is
// file_of(i)) goes whole to one thread, its chunks in order (like fio's numjobs or DCP's per-file
// writers).
template <typename FileOf, typename DoChunk>
void run_chunks(WorkerPool &pool, const IoOptions &opts, Control *control, std::int64_t start_ns, std::size_t chunks,
                std::size_t files, FileOf file_of, DoChunk do_chunk) {
    if (opts.schedule == Schedule::PerFile) {
        std::vector<std::vector<std::size_t>> by_file(files);
        for (std::size_t i = 0; i < chunks; ++i) by_file[file_of(i)].push_back(i);
        pool.run(opts.threads, by_file.size(), control, start_ns, opts.sample_interval_ns, opts.deadline_ns,
                 [&](std::size_t f, WorkerLog &log) {
                     std::uint64_t bytes = 0;
                     for (std::size_t i : by_file[f]) {
                         if (control && control->cancel.load(std::memory_order_relaxed)) break;
                         if (opts.deadline_ns > 0 && now_ns() >= opts.deadline_ns) {
                             pool.deadline_reached.store(true, std::memory_order_relaxed);
                             break;
                         }
                         bytes += do_chunk(i, log);
                     }
                     return bytes;
                 });
    } else {
        pool.run(opts.threads, chunks, control, start_ns, opts.sample_interval_ns, opts.deadline_ns, do_chunk);
    }
}

// The end of a write after its chunks ran (pool.fill done): a write stopped by the deadline syncs the
// files it cut short like the others; unless cancelled, every file is closed and the directories
// synced (`sync_dir`), all inside the timed region.
void finish_writes(IoResult &result, std::vector<std::unique_ptr<FileState>> &files,
                   const std::vector<std::string> &dirs, SyncMode sync, bool sync_dir) {
    if (result.deadline_reached && !result.cancelled) {
        for (auto &f : files) {
            std::size_t left = f->remaining.load();
            if (left != 0 && left != f->chunks)
                sync_fd((f->fd_buffered ? f->fd_buffered : f->fd_direct).get(), sync, f->path);
        }
    }
    if (result.cancelled) return;
    for (auto &f : files) f->close();
    if (sync_dir)
        for (const auto &dir : dirs) sync_directory(dir);
}

IoResult run_jobs(Kind kind, const std::vector<Job> &jobs, const IoOptions &opts, Control *control) {
    if (opts.threads < 1) throw std::invalid_argument("threads must be >= 1");
    if (opts.block_size == 0) throw std::invalid_argument("block_size must be > 0");

    IoResult result;
    result.direct_requested = opts.direct;
    result.sync = kind == Kind::Write ? opts.sync : SyncMode::None;

    std::vector<std::unique_ptr<FileState>> files;
    std::unordered_map<std::string, FileState *> by_path;
    std::vector<std::string> dirs;
    for (const auto &job : jobs) {
        if (by_path.count(job.path)) continue;
        files.push_back(std::make_unique<FileState>());
        files.back()->path = job.path;
        by_path[job.path] = files.back().get();
        std::string dir = parent_dir(job.path);
        if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(dir);
    }
    result.files = files.size();
    if (!opts.fds.empty()) {
        if (kind != Kind::Write) throw std::invalid_argument("descriptors are given for writes only");
        if (opts.fds.size() != files.size())
            throw std::invalid_argument(std::to_string(opts.fds.size()) + " descriptors given for " +
                                        std::to_string(files.size()) + " files: one per file, as the jobs first name them");
        for (std::size_t i = 0; i < files.size(); ++i) check_given_fd(opts.fds[i], 0, files[i]->path);
    }

    bool direct = opts.direct;
    if (direct) {
        if (kind == Kind::Write) {
            for (const auto &dir : dirs) {
                auto [ok, why] = probe_direct(dir);
                if (!ok) {
                    direct = false;
                    result.fallback_reason = why + " in " + dir;
                    break;
                }
            }
        } else if (!files.empty()) {
            auto [ok, why] = probe_direct_read(files.front()->path);
            if (!ok) {
                direct = false;
                result.fallback_reason = why + " for " + files.front()->path;
            }
        }
    }
    result.direct_used = direct;
    // Buffered writes are only durable once synced: a fallback from O_DIRECT keeps durability.
    if (kind == Kind::Write && opts.direct && !direct && result.sync == SyncMode::None)
        result.sync = SyncMode::Fdatasync;

    std::vector<Chunk> chunks;
    for (const auto &job : jobs) {
        FileState *file = by_path[job.path];
        for (std::size_t pos = 0; pos < job.nbytes;) {
            std::size_t len = std::min(opts.block_size, job.nbytes - pos);
            char *p = job.buf + pos;
            std::uint64_t off = job.offset + pos;
            bool aligned_start = direct && is_aligned(reinterpret_cast<std::uintptr_t>(p)) && is_aligned(off);
            if (aligned_start && !is_aligned(len) && len > kDirectAlign) {
                // An unaligned tail: the aligned head goes direct, the rest buffered.
                std::size_t head = len / kDirectAlign * kDirectAlign;
                chunks.push_back({file, p, head, off, true});
                chunks.push_back({file, p + head, len - head, off + head, false});
            } else {
                chunks.push_back({file, p, len, off, aligned_start && is_aligned(len)});
            }
            pos += len;
        }
    }
    for (auto &c : chunks) {
        (c.direct ? c.file->wants_direct : c.file->wants_buffered) = true;
        if (c.direct) {
            c.file->direct_begin = std::min(c.file->direct_begin, c.offset);
            c.file->direct_end = std::max(c.file->direct_end, c.offset + c.len);
        }
        c.file->remaining.fetch_add(1);
        ++c.file->chunks;
    }

    if (kind == Kind::Read && opts.drop_cache) {
        for (auto &f : files) {
            UniqueFd fd = open_file(f->path, O_RDONLY | O_CLOEXEC);
            // Dirty pages survive DONTNEED: write them back first so the read below is cold.
            retry_eintr([&] { return ::fdatasync(fd.get()); });
            ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
        }
    }

    // Timed region: open, transfer, per-file sync, close, directory sync.
    result.start_ns = now_ns();
    // Writes never follow a symlink planted under a file's name (reads may name /proc/self/fd links).
    int base_flags = (kind == Kind::Write ? (O_WRONLY | O_CREAT | O_NOFOLLOW) : O_RDONLY) | O_CLOEXEC;
    for (std::size_t i = 0; i < files.size(); ++i) {
        FileState &f = *files[i];
        if (!opts.fds.empty()) {
            if (f.wants_direct) f.fd_direct = reopen_for_writing(opts.fds[i], O_DIRECT, f.path);
            if (f.wants_buffered || !f.wants_direct) f.fd_buffered = reopen_for_writing(opts.fds[i], 0, f.path);
            continue;
        }
        if (f.wants_direct) f.fd_direct = open_file(f.path, base_flags | O_DIRECT, 0644);
        if (f.wants_buffered || !f.wants_direct) f.fd_buffered = open_file(f.path, base_flags, 0644);
    }
    if (kind == Kind::Write && opts.preallocate && opts.deadline_ns == 0)
        for (auto &f : files)
            if (f->fd_direct) reserve_range(f->fd_direct.get(), f->direct_begin, f->direct_end, f->path);

    SyncMode sync = result.sync;
    // One chunk: transfer it; the thread that finishes a file's last chunk syncs that file.
    auto do_chunk = [&](const Chunk &c, WorkerLog &log) -> std::uint64_t {
        FileState &f = *c.file;
        if (kind == Kind::Write && opts.before_write) opts.before_write(c.buf + c.len);
        timed(log, opts.record_latency, control, c.len, [&] {
            transfer(kind, (c.direct ? f.fd_direct : f.fd_buffered).get(), c.buf, c.len, c.offset, f.path);
        });
        if (kind == Kind::Write && f.remaining.fetch_sub(1) == 1)
            sync_fd((f.fd_buffered ? f.fd_buffered : f.fd_direct).get(), sync, f.path);
        return c.len;
    };
    std::unordered_map<FileState *, std::size_t> index;
    for (std::size_t i = 0; i < files.size(); ++i) index[files[i].get()] = i;
    WorkerPool pool;
    run_chunks(pool, opts, control, result.start_ns, chunks.size(), files.size(),
               [&](std::size_t i) { return index[chunks[i].file]; },
               [&](std::size_t i, WorkerLog &log) { return do_chunk(chunks[i], log); });
    result.interval_ns = std::max<std::int64_t>(opts.sample_interval_ns, 1);
    pool.fill(result, opts.record_latency);
    if (kind == Kind::Write) {
        finish_writes(result, files, dirs, sync, opts.sync_dir);
    } else if (!result.cancelled) {
        for (auto &f : files) f->close();  // closing is part of the timed region
    }
    result.end_ns = now_ns();
    return result;
}

}  // namespace

IoError::IoError(int err, std::string op, std::string path)
    : std::system_error(err, std::generic_category(), op + " " + path), op_(std::move(op)), path_(std::move(path)) {}

std::int64_t now_ns() noexcept {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

AlignedBuffer::AlignedBuffer(std::size_t nbytes, std::size_t alignment, bool prefault)
    : size_(nbytes), alignment_(alignment) {
    if (nbytes == 0) throw std::invalid_argument("AlignedBuffer size must be > 0");
    if (alignment < sizeof(void *) || (alignment & (alignment - 1)) != 0)
        throw std::invalid_argument("alignment must be a power of two >= " + std::to_string(sizeof(void *)));
    std::size_t padded = (nbytes + alignment - 1) / alignment * alignment;
    void *p = nullptr;
    if (::posix_memalign(&p, alignment, padded) != 0) throw std::bad_alloc();
    data_ = static_cast<char *>(p);
    if (prefault) std::memset(data_, 0, padded);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

std::pair<bool, std::string> probe_direct(const std::string &directory) {
    static std::mutex mutex;
    static std::map<std::string, std::pair<bool, std::string>> cache;
    static std::atomic<unsigned> counter{0};
    // Cached per directory inode, not per name: a name such as /proc/self/fd/N can reach another
    // directory (on another filesystem) later in the process.
    struct stat st {};
    std::string key = ::stat(directory.c_str(), &st) == 0
                          ? std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino)
                          : directory;
    {
        std::lock_guard<std::mutex> lock(mutex);
        auto it = cache.find(key);
        if (it != cache.end()) return it->second;
    }
    std::string probe = directory + "/.ckptbench-direct-probe-" + std::to_string(::getpid()) + "-" +
                        std::to_string(counter.fetch_add(1));
    std::pair<bool, std::string> verdict{true, ""};
    AlignedBuffer block(kDirectAlign, kDirectAlign, true);  // before the file exists: nothing to undo if it fails
    UniqueFd fd(retry_eintr([&] { return ::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_DIRECT | O_CLOEXEC, 0600); }));
    if (!fd) {
        int err = errno;
        if (err != EINVAL) throw IoError(err, "open", probe);
        verdict = {false, "open(O_DIRECT) is not supported: " + std::string(std::strerror(err))};
        // Some filesystems refuse O_DIRECT at open but may have created the file: remove it.
        ::unlink(probe.c_str());
    } else {
        ssize_t n = ::pwrite(fd.get(), block.data(), kDirectAlign, 0);
        int err = errno;
        fd.reset();
        ::unlink(probe.c_str());
        if (n < 0) {
            if (err != EINVAL) throw IoError(err, "pwrite", probe);
            verdict = {false, "pwrite(O_DIRECT) is not supported: " + std::string(std::strerror(err))};
        }
    }
    std::lock_guard<std::mutex> lock(mutex);
    cache[key] = verdict;
    return verdict;
}

IoResult write_jobs(const std::vector<Job> &jobs, const IoOptions &opts, Control *control) {
    return run_jobs(Kind::Write, jobs, opts, control);
}

IoResult read_jobs(const std::vector<Job> &jobs, const IoOptions &opts, Control *control) {
    return run_jobs(Kind::Read, jobs, opts, control);
}

IoResult write_gathered(const std::vector<GatherFile> &gathered, const std::vector<CrcRange> &ranges,
                        const IoOptions &opts, Control *control, std::vector<std::uint32_t> &crcs) {
    if (opts.threads < 1) throw std::invalid_argument("threads must be >= 1");
    if (opts.block_size == 0) throw std::invalid_argument("block_size must be > 0");
    const std::uint64_t block = opts.block_size;

    IoResult result;
    result.sync = opts.sync;
    result.files = gathered.size();
    std::vector<std::unique_ptr<FileState>> files;
    std::vector<std::string> dirs;
    std::unordered_map<std::string, std::size_t> seen;
    for (const auto &g : gathered) {
        if (!seen.emplace(g.path, files.size()).second)
            throw std::invalid_argument("a gathered write names " + g.path + " twice");
        std::uint64_t end = 0;
        for (const auto &seg : g.segments) {
            if (seg.offset < end || seg.nbytes > g.size || seg.offset > g.size - seg.nbytes)
                throw std::invalid_argument(g.path + ": segments must be sorted by offset, not overlap and lie "
                                            "inside the file's " + std::to_string(g.size) + " bytes");
            if (seg.nbytes && seg.src == nullptr) throw std::invalid_argument("a segment's source address is null");
            end = seg.offset + seg.nbytes;
        }
        if (g.fd >= 0) check_given_fd(g.fd, O_DIRECT, g.path);
        files.push_back(std::make_unique<FileState>());
        files.back()->path = g.path;
        std::string dir = parent_dir(g.path);
        if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(dir);
    }

    // Each file in block-size pieces of its bytes (an empty file: one empty piece, still synced), each
    // with the first segment that ends after its start.
    struct Piece {
        std::size_t file;
        std::uint64_t offset;
        std::size_t len;
        std::size_t segment;
    };
    std::vector<Piece> pieces;
    std::vector<std::size_t> first_piece(gathered.size());
    for (std::size_t f = 0; f < gathered.size(); ++f) {
        const auto &segs = gathered[f].segments;
        first_piece[f] = pieces.size();
        std::size_t seg = 0;
        std::uint64_t off = 0;
        do {
            while (seg < segs.size() && segs[seg].offset + segs[seg].nbytes <= off) ++seg;
            auto len = static_cast<std::size_t>(std::min(block, gathered[f].size - off));
            pieces.push_back({f, off, len, seg});
            off += len;
        } while (off < gathered[f].size);
        files[f]->chunks = pieces.size() - first_piece[f];
        files[f]->remaining = files[f]->chunks;
    }

    // The ranges to checksum, cut where the pieces are cut: each part is checksummed by the thread
    // writing its piece, and a range's parts are combined in order at the end.
    struct Part {
        const char *src;
        std::size_t nbytes;
    };
    std::vector<Part> parts;
    std::vector<std::size_t> range_parts(ranges.size() + 1, 0);
    std::vector<std::vector<std::size_t>> parts_of_piece(pieces.size());
    for (std::size_t r = 0; r < ranges.size(); ++r) {
        const CrcRange &range = ranges[r];
        range_parts[r] = parts.size();
        if (range.file >= gathered.size()) throw std::invalid_argument("a checksum range names a file not written");
        const auto &segs = gathered[range.file].segments;
        auto it = std::upper_bound(segs.begin(), segs.end(), range.offset,
                                   [](std::uint64_t off, const Segment &seg) { return off < seg.offset; });
        if (range.nbytes == 0) continue;
        if (it == segs.begin() || range.offset + range.nbytes > std::prev(it)->offset + std::prev(it)->nbytes)
            throw std::invalid_argument("checksum range (" + std::to_string(range.offset) + ", " +
                                        std::to_string(range.nbytes) + ") of " + gathered[range.file].path +
                                        " does not lie inside one segment");
        const Segment &seg = *std::prev(it);
        for (std::uint64_t pos = range.offset, end = range.offset + range.nbytes; pos < end;) {
            std::uint64_t stop = std::min(end, (pos / block + 1) * block);
            parts_of_piece[first_piece[range.file] + pos / block].push_back(parts.size());
            parts.push_back({seg.src + (pos - seg.offset), static_cast<std::size_t>(stop - pos)});
            pos = stop;
        }
    }
    range_parts[ranges.size()] = parts.size();
    std::vector<std::uint32_t> part_crcs(parts.size(), 0);

    // Timed region: open, write, per-file sync, close, directory sync (as write_jobs).
    result.start_ns = now_ns();
    for (std::size_t i = 0; i < files.size(); ++i) {
        FileState &f = *files[i];
        if (gathered[i].fd >= 0) {
            f.fd_buffered = UniqueFd(gathered[i].fd);
            f.borrowed = true;
        } else {
            f.fd_buffered = open_file(f.path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
        }
    }
    auto do_piece = [&](std::size_t i, WorkerLog &log) -> std::uint64_t {
        const Piece &piece = pieces[i];
        FileState &f = *files[piece.file];
        for (std::size_t k : parts_of_piece[i]) part_crcs[k] = crc32c(parts[k].src, parts[k].nbytes);
        std::vector<iovec> iov;
        auto zeros = [&](std::uint64_t n) {
            for (; n; n -= std::min<std::uint64_t>(n, sizeof kZeros))
                iov.push_back({kZeros, static_cast<std::size_t>(std::min<std::uint64_t>(n, sizeof kZeros))});
        };
        const auto &segs = gathered[piece.file].segments;
        std::uint64_t pos = piece.offset, end = piece.offset + piece.len;
        for (std::size_t k = piece.segment; k < segs.size() && segs[k].offset < end; ++k) {
            const Segment &seg = segs[k];
            std::uint64_t stop = std::min<std::uint64_t>(seg.offset + seg.nbytes, end);
            if (stop <= pos) continue;
            if (seg.offset > pos) zeros(seg.offset - pos);
            std::uint64_t from = std::max(pos, seg.offset);
            iov.push_back({const_cast<char *>(seg.src) + (from - seg.offset), static_cast<std::size_t>(stop - from)});
            pos = stop;
        }
        if (pos < end) zeros(end - pos);
        timed(log, opts.record_latency, control, piece.len,
              [&] { pwritev_all(f.fd_buffered.get(), iov, piece.offset, f.path); });
        if (f.remaining.fetch_sub(1) == 1) sync_fd(f.fd_buffered.get(), opts.sync, f.path);
        return piece.len;
    };
    WorkerPool pool;
    run_chunks(pool, opts, control, result.start_ns, pieces.size(), files.size(),
               [&](std::size_t i) { return pieces[i].file; }, do_piece);
    result.interval_ns = std::max<std::int64_t>(opts.sample_interval_ns, 1);
    pool.fill(result, opts.record_latency);
    finish_writes(result, files, dirs, opts.sync, opts.sync_dir);
    result.end_ns = now_ns();
    crcs.assign(ranges.size(), 0);
    if (!result.cancelled && !result.deadline_reached)
        for (std::size_t r = 0; r < ranges.size(); ++r)
            for (std::size_t k = range_parts[r]; k < range_parts[r + 1]; ++k)
                crcs[r] = crc32c_combine(crcs[r], part_crcs[k], parts[k].nbytes);
    return result;
}

IoResult metadata_bench(const std::string &directory, std::size_t files, std::size_t file_size,
                        int threads, SyncMode sync, Control *control) {
    if (threads < 1) throw std::invalid_argument("threads must be >= 1");
    if (files == 0 || file_size == 0) throw std::invalid_argument("files and file_size must be > 0");
    AlignedBuffer payload(file_size, kDirectAlign, true);
    fill_random(payload.data(), file_size, 0x6d657461);
    IoResult result;
    result.sync = sync;
    result.files = files;
    result.start_ns = now_ns();
    WorkerPool pool;
    pool.run(threads, files, control, result.start_ns, 1000000000, 0, [&](std::size_t i, WorkerLog &log) {
        std::string path = directory + "/md-" + std::to_string(i);
        return timed(log, true, control, file_size, [&] {
            UniqueFd fd = open_file(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
            transfer(Kind::Write, fd.get(), payload.data(), file_size, 0, path);
            sync_fd(fd.get(), sync, path);
            if (fd.close() != 0) throw IoError(errno, "close", path);
        });
    });
    result.interval_ns = 1000000000;
    pool.fill(result, true);
    if (!result.cancelled && sync != SyncMode::None) sync_directory(directory);
    result.end_ns = now_ns();
    return result;
}

double memcpy_bandwidth(std::size_t nbytes, int repeats) {
    if (nbytes == 0 || repeats < 1) throw std::invalid_argument("nbytes and repeats must be > 0");
    AlignedBuffer src(nbytes, kDirectAlign, true), dst(nbytes, kDirectAlign, true);
    fill_random(src.data(), nbytes, 1);
    return copy_bandwidth(dst.data(), src.data(), nbytes, repeats);
}

double copy_bandwidth(char *dst, const char *src, std::size_t nbytes, int repeats) {
    if (nbytes == 0 || repeats < 1) throw std::invalid_argument("nbytes and repeats must be > 0");
    std::int64_t best = INT64_MAX;
    for (int r = 0; r < repeats; ++r) {
        std::int64_t t0 = now_ns();
        std::memcpy(dst, src, nbytes);
        std::int64_t t1 = now_ns();
        best = std::min(best, t1 - t0);
    }
    return static_cast<double>(nbytes) / (std::max<std::int64_t>(best, 1) * 1e-9);
}

void fill_random(char *buf, std::size_t nbytes, std::uint64_t seed) {
    std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 0x2545F4914F6CDD1DULL;
    if (x == 0) x = 1;
    std::size_t words = nbytes / 8;
    auto *out = reinterpret_cast<unsigned char *>(buf);
    for (std::size_t i = 0; i < words; ++i) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        std::uint64_t v = x * 0x2545F4914F6CDD1DULL;
        std::memcpy(out + i * 8, &v, 8);
    }
    for (std::size_t i = words * 8; i < nbytes; ++i) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out[i] = static_cast<unsigned char>((x * 0x2545F4914F6CDD1DULL) >> 56);
    }
}

}  // namespace ckpt
