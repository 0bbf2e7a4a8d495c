// The one Python boundary of the engine: named, typed arguments with defaults, the GIL released
// around every blocking call, IoError mapped to OSError (errno + path), AlignedBuffer exported
// through the buffer protocol so numpy, memoryview and torch.frombuffer see its memory without
// copies. ckptbench/_native.pyi is generated from this module by nanobind's stubgen
// (tests/native/test_stub.py regenerates it and compares).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "checksum.hpp"
#include "copy.hpp"
#include "engine.hpp"
#include "cow_copy.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// Any object supporting the buffer protocol; its memory is taken with PyObject_GetBuffer in the call.
class buffer : public nb::object {
    NB_OBJECT_DEFAULT(buffer, object, "typing_extensions.Buffer", PyObject_CheckBuffer)
};

// Jobs of write() and read(): (buffer, path, offset) tuples.
using IoJobs = nb::typed<nb::sequence, nb::typed<nb::tuple, buffer, nb::str, int>>;
// Jobs of copy_from_addresses() and CowCopy: (address, destination offset, nbytes[, zeros after])
// rows, as an int64 table or as tuples.
using CopyTable = nb::ndarray<const std::int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using CopyTuples = nb::typed<nb::handle, std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>>>;

// Files of write_gathered(): (path, segments table, size) tuples.
using GatherJobs = nb::typed<nb::sequence, nb::typed<nb::tuple, nb::str, nb::ndarray<const std::int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>, int>>;
constexpr const char *kSegmentsShape =
    "segments must be a C-contiguous int64 array of shape (n, 3): (source address, file offset, nbytes) rows";
constexpr const char *kRangesShape =
    "ranges must be a C-contiguous int64 array of shape (n, 3): (file index, offset, nbytes) rows";

int aligned_buffer_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    auto *buf = nb::inst_ptr<ckpt::AlignedBuffer>(self);
    return PyBuffer_FillInfo(view, self, buf->data(), static_cast<Py_ssize_t>(buf->size()), 0, flags);
}

PyType_Slot aligned_buffer_slots[] = {
    {Py_bf_getbuffer, reinterpret_cast<void *>(aligned_buffer_getbuffer)},
    {0, nullptr},
};

// Py_buffer views held for the duration of a call; released (with the GIL held) on scope exit.
struct HeldBuffers {
    std::vector<Py_buffer> views;
    ~HeldBuffers() {
        for (auto &v : views) PyBuffer_Release(&v);
    }
    HeldBuffers() { views.reserve(4); }
    Py_buffer &acquire(nb::handle obj, bool writable, int extra_flags = 0) {
        views.emplace_back();
        Py_buffer &view = views.back();
        int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0) | extra_flags;
        if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) {
            views.pop_back();
            throw nb::python_error();
        }
        return view;
    }
};

// jobs: a sequence of (buffer, path, offset); the whole buffer is one job.
std::vector<ckpt::Job> to_jobs(const nb::sequence &seq, HeldBuffers &held, bool writable) {
    std::vector<ckpt::Job> out;
    std::size_t n = nb::len(seq);
    held.views.reserve(n);  // no reallocation while Job.buf points into the views' memory
    out.reserve(n);
    for (nb::handle item : seq) {
        nb::tuple t = nb::cast<nb::tuple>(item);
        if (nb::len(t) != 3) throw nb::value_error("each job must be a (buffer, path, offset) tuple");
        Py_buffer &view = held.acquire(t[0], writable);
        out.push_back({static_cast<char *>(view.buf), static_cast<std::size_t>(view.len),
                       nb::cast<std::string>(t[1]), nb::cast<std::uint64_t>(t[2])});
    }
    return out;
}

// Checks copy jobs into the buffer `view` against its bounds, one (address, destination offset,
// nbytes, zeros after) at a time.
class CopyJobs {
public:
    explicit CopyJobs(const Py_buffer &view) : view_(view) {}

    void add(std::uint64_t src, std::uint64_t offset, std::uint64_t nbytes, std::uint64_t zero_after) {
        auto len = static_cast<std::size_t>(view_.len);
        if (offset > len || nbytes > len - offset || zero_after > len - offset - nbytes)
            throw nb::index_error(("copy to (" + std::to_string(offset) + ", " + std::to_string(nbytes) +
                                   (zero_after ? " + " + std::to_string(zero_after) + " zeros" : std::string()) +
                                   ") is outside the destination of " + std::to_string(len) + " bytes").c_str());
        if (nbytes && src == 0) throw nb::value_error("source address is null");
        jobs_.push_back({reinterpret_cast<const char *>(static_cast<std::uintptr_t>(src)),
                         static_cast<char *>(view_.buf) + offset, static_cast<std::size_t>(nbytes),
                         static_cast<std::size_t>(zero_after)});
    }
    std::vector<ckpt::CopyJob> take() { return std::move(jobs_); }

private:
    const Py_buffer &view_;
    std::vector<ckpt::CopyJob> jobs_;
};

constexpr const char *kTableShape =
    "a jobs table must be a C-contiguous int64 array of shape (n, 3) or (n, 4): (address, offset, nbytes[, zeros "
    "after]) rows";

// Rows of an int64 table of shape (n, 3) or (n, 4).
std::vector<ckpt::CopyJob> copy_jobs(const Py_buffer &view, const CopyTable &table) {
    const std::size_t width = table.shape(1);
    if (width != 3 && width != 4) throw nb::value_error(kTableShape);
    CopyJobs jobs(view);
    const std::int64_t *row = table.data();
    for (std::size_t i = 0; i < table.shape(0); ++i, row += width) {
        std::int64_t zeros = width == 4 ? row[3] : 0;
        if (row[0] < 0 || row[1] < 0 || row[2] < 0 || zeros < 0) throw nb::value_error("a jobs table row is negative");
        jobs.add(static_cast<std::uint64_t>(row[0]), static_cast<std::uint64_t>(row[1]),
                 static_cast<std::uint64_t>(row[2]), static_cast<std::uint64_t>(zeros));
    }
    return jobs.take();
}

// A sequence of (address, offset, nbytes) tuples. A buffer that is not an int64 table of the right
// shape (another dtype, byte order, rank or layout) is refused rather than read as tuples.
std::vector<ckpt::CopyJob> copy_jobs(const Py_buffer &view, nb::handle tuples) {
    if (PyObject_CheckBuffer(tuples.ptr())) throw nb::value_error(kTableShape);
    CopyJobs jobs(view);
    for (const auto &[src, offset, nbytes] :
         nb::cast<std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>>>(tuples))
        jobs.add(src, offset, nbytes, 0);
    return jobs.take();
}

// A CowCopy with its destination kept exported (not resizable, not freed) until it is gone.
struct PyCowCopy {
    Py_buffer dst{};
    std::unique_ptr<ckpt::CowCopy> cow_copy;
    ~PyCowCopy() {
        cow_copy.reset();  // finishes first: the copies write into dst
        if (dst.obj) PyBuffer_Release(&dst);
    }
};

const char *sync_name(ckpt::SyncMode mode) {
    switch (mode) {
        case ckpt::SyncMode::None: return "none";
        case ckpt::SyncMode::Fdatasync: return "fdatasync";
        case ckpt::SyncMode::Fsync: return "fsync";
    }
    return "none";
}

ckpt::IoOptions make_options(int threads, std::size_t block_size, bool direct, ckpt::SyncMode sync, bool sync_dir,
                             bool drop_cache, bool record_latency, ckpt::Schedule schedule,
                             std::int64_t sample_interval_ns, std::int64_t deadline_ns) {
    if (sample_interval_ns <= 0) throw std::invalid_argument("sample_interval_ns must be > 0");
    ckpt::IoOptions o;
    o.sample_interval_ns = sample_interval_ns;
    o.deadline_ns = deadline_ns;
    o.schedule = schedule;
    o.threads = threads;
    o.block_size = block_size;
    o.direct = direct;
    o.sync = sync;
    o.sync_dir = sync_dir;
    o.drop_cache = drop_cache;
    o.record_latency = record_latency;
    return o;
}

// copy_from_addresses() for either form of jobs.
template <typename Jobs>
void copy_from_addresses(buffer dst, const Jobs &jobs, int threads) {
    HeldBuffers held;
    Py_buffer &view = held.acquire(dst, true);
    std::vector<ckpt::CopyJob> copies = copy_jobs(view, jobs);
    nb::gil_scoped_release release;
    ckpt::parallel_copy(copies, threads);
}

// CowCopy.__init__ for either form of jobs.
template <typename Jobs>
void init_cow_copy(PyCowCopy *self, buffer dst, const Jobs &jobs, int threads, std::size_t chunk_bytes,
                   std::size_t min_region_bytes, std::size_t max_regions) {
    HeldBuffers held;
    Py_buffer &view = held.acquire(dst, true);
    std::vector<ckpt::CopyJob> copies = copy_jobs(view, jobs);
    std::unique_ptr<ckpt::CowCopy> cow_copy;
    {
        nb::gil_scoped_release release;
        cow_copy = std::make_unique<ckpt::CowCopy>(std::move(copies), threads, chunk_bytes, min_region_bytes,
                                                    max_regions);
    }
    new (self) PyCowCopy();
    self->cow_copy = std::move(cow_copy);
    if (PyObject_GetBuffer(dst.ptr(), &self->dst, PyBUF_SIMPLE | PyBUF_WRITABLE) != 0) {
        self->dst = Py_buffer{};
        PyErr_Clear();  // held above: cannot fail; the cow_copy is still finished before dst goes
    }
}

}  // namespace

NB_MODULE(_native, m) {
    m.doc() = "ckptbench native I/O engine (C++17). Blocking calls release the GIL.";
    // Buffers are legitimately alive at exit (torch tensors viewing a loaded checkpoint, the
    // process-wide staging arena); nanobind's shutdown leak report would only be noise.
    nb::set_leak_warnings(false);

    nb::register_exception_translator([](const std::exception_ptr &p, void *) {
        try {
            std::rethrow_exception(p);
        } catch (const ckpt::IoError &e) {
            int err = e.code().value();
            std::string msg = std::string(std::strerror(err)) + " (" + e.op() + ")";
            // OSError(errno, strerror, filename) picks the matching subclass (FileNotFoundError...).
            PyObject *exc = PyObject_CallFunction(PyExc_OSError, "iss", err, msg.c_str(), e.path().c_str());
            if (exc != nullptr) {
                PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(exc)), exc);
                Py_DECREF(exc);
            }
        }
    });

    nb::enum_<ckpt::SyncMode>(m, "SyncMode", "What makes a written file durable before the call returns.")
        .value("none", ckpt::SyncMode::None, "Nothing: the data may still be in the page cache.")
        .value("fdatasync", ckpt::SyncMode::Fdatasync, "fdatasync(2) once a file's last block is written.")
        .value("fsync", ckpt::SyncMode::Fsync, "fsync(2) once a file's last block is written.");

    nb::enum_<ckpt::Schedule>(m, "Schedule", "How blocks meet threads.")
        .value("shared", ckpt::Schedule::Shared, "One queue of blocks in file order; threads share each file.")
        .value("per_file", ckpt::Schedule::PerFile, "Each thread takes the next whole file and streams it.");

    nb::class_<ckpt::AlignedBuffer>(m, "AlignedBuffer", nb::type_slots(aligned_buffer_slots),
                                    "Page-aligned host memory, touched once at construction; supports the buffer protocol.")
        .def(nb::init<std::size_t, std::size_t, bool>(), "nbytes"_a, "alignment"_a = 4096, "prefault"_a = true,
             nb::call_guard<nb::gil_scoped_release>())
        .def_prop_ro("nbytes", &ckpt::AlignedBuffer::size)
        .def_prop_ro("alignment", &ckpt::AlignedBuffer::alignment)
        .def_prop_ro("address", [](const ckpt::AlignedBuffer &b) { return reinterpret_cast<std::uintptr_t>(b.data()); })
        .def("__len__", &ckpt::AlignedBuffer::size);

    nb::class_<ckpt::Control>(m, "Control", "Progress counter and cancellation flag shared with a running call.")
        .def(nb::init<>())
        .def("cancel", [](ckpt::Control &c) { c.cancel.store(true); }, "Ask the running call to stop between blocks.")
        .def_prop_ro("bytes_done", [](const ckpt::Control &c) { return c.bytes_done.load(); })
        .def_prop_ro("cancel_requested", [](const ckpt::Control &c) { return c.cancel.load(); });

    nb::class_<ckpt::ThreadStat>(m, "ThreadStat")
        .def_ro("start_ns", &ckpt::ThreadStat::start_ns)
        .def_ro("end_ns", &ckpt::ThreadStat::end_ns)
        .def_ro("bytes", &ckpt::ThreadStat::bytes)
        .def_ro("ops", &ckpt::ThreadStat::ops);

    nb::class_<ckpt::IoResult>(m, "IoResult")
        .def_ro("bytes", &ckpt::IoResult::bytes)
        .def_ro("ops", &ckpt::IoResult::ops)
        .def_ro("start_ns", &ckpt::IoResult::start_ns)
        .def_ro("end_ns", &ckpt::IoResult::end_ns)
        .def_prop_ro("seconds", &ckpt::IoResult::seconds)
        .def_ro("threads", &ckpt::IoResult::threads)
        .def_ro("files", &ckpt::IoResult::files)
        .def_ro("direct_requested", &ckpt::IoResult::direct_requested)
        .def_ro("direct_used", &ckpt::IoResult::direct_used)
        .def_ro("fallback_reason", &ckpt::IoResult::fallback_reason)
        .def_prop_ro("sync", [](const ckpt::IoResult &r) { return sync_name(r.sync); })
        .def_ro("cancelled", &ckpt::IoResult::cancelled)
        .def_ro("deadline_reached", &ckpt::IoResult::deadline_reached)
        .def_ro("interval_ns", &ckpt::IoResult::interval_ns)
        .def_prop_ro(
            "latencies_ns",
            [](ckpt::IoResult &r) {
                return nb::ndarray<nb::numpy, const std::uint64_t, nb::ndim<1>>(r.latencies_ns.data(),
                                                                               {r.latencies_ns.size()});
            },
            nb::rv_policy::reference_internal)
        .def_prop_ro(
            "timeline_bytes",
            [](ckpt::IoResult &r) {
                return nb::ndarray<nb::numpy, const std::uint64_t, nb::ndim<1>>(r.timeline_bytes.data(),
                                                                               {r.timeline_bytes.size()});
            },
            nb::rv_policy::reference_internal, "Bytes completed in each interval_ns since start_ns.")
        .def_prop_ro(
            "latency_histogram",
            [](ckpt::IoResult &r) {
                return nb::ndarray<nb::numpy, const std::uint64_t, nb::ndim<1>>(r.latency_histogram.data(),
                                                                               {r.latency_histogram.size()});
            },
            nb::rv_policy::reference_internal,
            "Operations per latency bucket: one per nanosecond below 8 ns, then 8 equal buckets per power of two.");

    m.def(
        "write",
        [](const IoJobs &jobs, int threads, std::size_t block_size, bool direct, ckpt::SyncMode sync, bool sync_dir,
           bool record_latency, ckpt::Schedule schedule, ckpt::Control *control, PyCowCopy *after,
           std::int64_t sample_interval_ns, std::int64_t deadline_ns, bool preallocate, std::vector<int> fds) {
            HeldBuffers held;
            auto parsed = to_jobs(jobs, held, false);
            auto opts = make_options(threads, block_size, direct, sync, sync_dir, true, record_latency, schedule,
                                     sample_interval_ns, deadline_ns);
            opts.preallocate = preallocate;
            opts.fds = std::move(fds);
            if (after) {
                ckpt::CowCopy *cow_copy = after->cow_copy.get();
                opts.before_write = [cow_copy](const char *end) { cow_copy->wait_copied(end); };
            }
            nb::gil_scoped_release release;
            return ckpt::write_jobs(parsed, opts, control);
        },
        "jobs"_a, "threads"_a = 1, "block_size"_a = 4u << 20, "direct"_a = true, "sync"_a = ckpt::SyncMode::Fdatasync,
        "sync_dir"_a = true, "record_latency"_a = true, "schedule"_a = ckpt::Schedule::Shared,
        "control"_a = nb::none(), "after"_a = nb::none(), "sample_interval_ns"_a = 1000000000, "deadline_ns"_a = 0,
        "preallocate"_a = false, "fds"_a = std::vector<int>{},
        "Write each (buffer, path, offset) job; durable per `sync` when it returns. `after`: a CowCopy still "
        "copying into the buffers; each block is written once its bytes are copied (if the CowCopy fails, "
        "they are written as they are: its finish() raises). `sample_interval_ns`: the timeline's interval. "
        "`deadline_ns` (CLOCK_MONOTONIC, 0: none): no block starts after it; the files written are still synced. "
        "`preallocate`: on ext4, each file's range of O_DIRECT blocks is reserved with fallocate first (sizing "
        "the file to its end), so blocks written side by side into one file do not take turns on its inode "
        "lock (ignored with a deadline). `fds`: one descriptor per file, open for writing, in the order the jobs "
        "first name each file; each file is written through a reopening of its descriptor (/proc/self/fd), not "
        "opened by its path, which then serves the O_DIRECT probe, the directory sync and messages.");

    m.def(
        "write_gathered",
        [](const GatherJobs &files, const CopyTable &ranges, int threads, std::size_t block_size, ckpt::SyncMode sync,
           bool sync_dir, bool record_latency, ckpt::Schedule schedule, ckpt::Control *control,
           const std::vector<int> &fds) {
            if (!fds.empty() && fds.size() != nb::len(files))
                throw nb::value_error("fds must hold one descriptor per file, or none");
            std::vector<ckpt::GatherFile> gathered;
            gathered.reserve(nb::len(files));
            for (nb::handle item : files) {
                auto [path, table, size] = nb::cast<std::tuple<std::string, CopyTable, std::uint64_t>>(item);
                if (table.shape(1) != 3) throw nb::value_error(kSegmentsShape);
                ckpt::GatherFile file{path, {}, size, fds.empty() ? -1 : fds[gathered.size()]};
                if (!fds.empty() && file.fd < 0) throw nb::value_error("a descriptor in fds is negative");
                file.segments.reserve(table.shape(0));
                const std::int64_t *row = table.data();
                for (std::size_t i = 0; i < table.shape(0); ++i, row += 3) {
                    if (row[0] < 0 || row[1] < 0 || row[2] < 0) throw nb::value_error("a segments row is negative");
                    file.segments.push_back({reinterpret_cast<const char *>(static_cast<std::uintptr_t>(row[0])),
                                             static_cast<std::uint64_t>(row[1]), static_cast<std::size_t>(row[2])});
                }
                gathered.push_back(std::move(file));
            }
            if (ranges.shape(1) != 3) throw nb::value_error(kRangesShape);
            std::vector<ckpt::CrcRange> crc_ranges;
            crc_ranges.reserve(ranges.shape(0));
            const std::int64_t *row = ranges.data();
            for (std::size_t i = 0; i < ranges.shape(0); ++i, row += 3) {
                if (row[0] < 0 || row[1] < 0 || row[2] < 0) throw nb::value_error("a checksum ranges row is negative");
                crc_ranges.push_back({static_cast<std::size_t>(row[0]), static_cast<std::uint64_t>(row[1]),
                                      static_cast<std::size_t>(row[2])});
            }
            auto opts = make_options(threads, block_size, false, sync, sync_dir, false, record_latency, schedule,
                                     1000000000, 0);
            std::vector<std::uint32_t> crcs;
            ckpt::IoResult result;
            {
                nb::gil_scoped_release release;
                result = ckpt::write_gathered(gathered, crc_ranges, opts, control, crcs);
            }
            return std::make_pair(std::move(result), std::move(crcs));
        },
        "files"_a, "ranges"_a.noconvert(), "threads"_a = 1, "block_size"_a = 4u << 20,
        "sync"_a = ckpt::SyncMode::Fdatasync, "sync_dir"_a = true, "record_latency"_a = true,
        "schedule"_a = ckpt::Schedule::Shared, "control"_a = nb::none(), "fds"_a = std::vector<int>(),
        "Write each (path, segments, size) file from memory where its bytes already are, buffered (never "
        "O_DIRECT): `segments` is a C-contiguous int64 table of (source address, file offset, nbytes) rows, "
        "sorted by offset, not overlapping, inside `size`; the bytes between them are written as zeros. Each "
        "block_size piece of a file is one pwritev. `ranges`: an int64 table of (file index, offset, nbytes) "
        "rows, each inside one segment; their CRC-32C, computed by the thread writing those bytes just before "
        "it does, are returned with the IoResult. Durable per `sync` when it returns. The caller guarantees "
        "every source address stays valid and readable for nbytes during the call (e.g. a contiguous CPU "
        "tensor's data_ptr()). `fds`: none, or one descriptor per file (open for writing, without O_APPEND "
        "or O_DIRECT) written through instead of opening its path; the caller closes them, and the paths "
        "then name the files in errors and their directories for `sync_dir`.");

    m.def(
        "read",
        [](const IoJobs &jobs, int threads, std::size_t block_size, bool direct, bool drop_cache, bool record_latency,
           ckpt::Schedule schedule, ckpt::Control *control, std::int64_t sample_interval_ns,
           std::int64_t deadline_ns) {
            HeldBuffers held;
            auto parsed = to_jobs(jobs, held, true);
            auto opts = make_options(threads, block_size, direct, ckpt::SyncMode::None, false, drop_cache,
                                     record_latency, schedule, sample_interval_ns, deadline_ns);
            nb::gil_scoped_release release;
            return ckpt::read_jobs(parsed, opts, control);
        },
        "jobs"_a, "threads"_a = 1, "block_size"_a = 4u << 20, "direct"_a = true, "drop_cache"_a = true,
        "record_latency"_a = true, "schedule"_a = ckpt::Schedule::Shared, "control"_a = nb::none(),
        "sample_interval_ns"_a = 1000000000, "deadline_ns"_a = 0,
        "Read each (writable buffer, path, offset) job, filling the buffer completely (or until `deadline_ns`, "
        "CLOCK_MONOTONIC, when not 0). `sample_interval_ns`: the timeline's interval.");

    m.def("metadata_bench", &ckpt::metadata_bench, "directory"_a, "files"_a, "file_size"_a = 4096, "threads"_a = 1,
          "sync"_a = ckpt::SyncMode::Fsync, "control"_a = nb::none(), nb::call_guard<nb::gil_scoped_release>(),
          "Create, write, sync and close `files` small files in `directory`.");

    m.def("probe_direct", &ckpt::probe_direct, "directory"_a, nb::call_guard<nb::gil_scoped_release>(),
          "(supported, reason): whether `directory` accepts O_DIRECT writes (cached per directory).");

    m.def("memcpy_bandwidth", &ckpt::memcpy_bandwidth, "nbytes"_a = 256u << 20, "repeats"_a = 5,
          nb::call_guard<nb::gil_scoped_release>(), "Best single-thread memcpy bandwidth, bytes/s.");

    m.def(
        "copy_bandwidth",
        [](buffer dst, buffer src, int repeats) {
            HeldBuffers held;
            Py_buffer &d = held.acquire(dst, true);
            Py_buffer &s = held.acquire(src, false);
            auto n = static_cast<std::size_t>(std::min(d.len, s.len));
            char *dp = static_cast<char *>(d.buf);
            const char *sp = static_cast<const char *>(s.buf);
            nb::gil_scoped_release release;
            return ckpt::copy_bandwidth(dp, sp, n, repeats);
        },
        "dst"_a, "src"_a, "repeats"_a = 3,
        "Best memcpy bandwidth (bytes/s) copying src into dst (the shorter length), without allocating.");

    m.def(
        "crc32c",
        [](buffer data, std::uint32_t crc) {
            HeldBuffers held;
            Py_buffer &view = held.acquire(data, false);
            const char *bytes = static_cast<const char *>(view.buf);
            auto n = static_cast<std::size_t>(view.len);
            nb::gil_scoped_release release;
            return ckpt::crc32c(bytes, n, crc);
        },
        "buffer"_a, "crc"_a = 0, "CRC-32C of a buffer (continue from `crc` to checksum in pieces).");

    m.def(
        "crc32c_ranges",
        [](buffer data, const std::vector<std::pair<std::size_t, std::size_t>> &ranges, int threads) {
            HeldBuffers held;
            Py_buffer &view = held.acquire(data, false);
            auto len = static_cast<std::size_t>(view.len);
            for (const auto &[offset, nbytes] : ranges)
                if (offset > len || nbytes > len - offset)
                    throw nb::index_error(("range (" + std::to_string(offset) + ", " + std::to_string(nbytes) +
                                           ") is outside the buffer of " + std::to_string(len) + " bytes").c_str());
            const char *base = static_cast<const char *>(view.buf);
            nb::gil_scoped_release release;
            return ckpt::crc32c_ranges(base, ranges, threads);
        },
        "buffer"_a, "ranges"_a, "threads"_a = 1, "One CRC-32C per (offset, nbytes) range of `buffer`, on N threads.");

    m.def("crc32c_hardware", &ckpt::crc32c_hardware, "Whether CRC-32C uses the CPU instruction (SSE4.2).");

    m.def("copy_from_addresses", &copy_from_addresses<CopyTable>, "dst"_a, "jobs"_a.noconvert(), "threads"_a = 1,
          "Copy (source address, destination offset, nbytes) jobs into `dst` on N threads. `jobs` is a sequence "
        "of tuples or a C-contiguous int64 table of such rows (e.g. a numpy array of shape (n, 3)); a fourth "
        "column zeroes that many bytes right after each copy (padding; the address may be 0 with nbytes 0). The caller "
        "guarantees each source address stays valid and readable for nbytes during the call (e.g. a contiguous "
        "CPU tensor's data_ptr()).");
    m.def("copy_from_addresses", &copy_from_addresses<CopyTuples>, "dst"_a, "jobs"_a, "threads"_a = 1,
          "Copy (source address, destination offset, nbytes) jobs into `dst` on N threads. `jobs` is a sequence "
        "of tuples or a C-contiguous int64 table of such rows (e.g. a numpy array of shape (n, 3)); a fourth "
        "column zeroes that many bytes right after each copy (padding; the address may be 0 with nbytes 0). The caller "
        "guarantees each source address stays valid and readable for nbytes during the call (e.g. a contiguous "
        "CPU tensor's data_ptr()).");

    m.def("cow_unavailable", &ckpt::cow_unavailable,
          "Why copy-on-write copies (CowCopy) cannot be taken in this process; '' when they can.");

    nb::class_<PyCowCopy>(m, "CowCopy",
                           "Copy-on-write staging: write-protects the sources of copy_from_addresses-style jobs and "
                           "copies them into `dst` on background threads; a write to a page not yet copied waits "
                           "until its chunk is copied. The caller may write to the sources as soon as it returns.")
        .def("__init__", &init_cow_copy<CopyTable>, "dst"_a, "jobs"_a.noconvert(), "threads"_a = 1,
             "chunk_bytes"_a = 1 << 20, "min_region_bytes"_a = 256 << 10, "max_regions"_a = 4096,
             "Protect the jobs' sources and start copying; jobs as for copy_from_addresses. The sources' pages, "
             "merged where they touch, form regions: those under `min_region_bytes`, all but the `max_regions` "
             "largest, and any outside private anonymous memory are copied before it returns. Raises RuntimeError "
             "when copy-on-write copies are unavailable (see cow_unavailable()).")
        .def("__init__", &init_cow_copy<CopyTuples>, "dst"_a, "jobs"_a, "threads"_a = 1, "chunk_bytes"_a = 1 << 20,
             "min_region_bytes"_a = 256 << 10, "max_regions"_a = 4096,
             "Protect the jobs' sources and start copying; jobs as for copy_from_addresses. The sources' pages, "
             "merged where they touch, form regions: those under `min_region_bytes`, all but the `max_regions` "
             "largest, and any outside private anonymous memory are copied before it returns. Raises RuntimeError "
             "when copy-on-write copies are unavailable (see cow_unavailable()).")
        .def("finish", [](PyCowCopy &s) { s.cow_copy->finish(); }, nb::call_guard<nb::gil_scoped_release>(),
             "Wait until every byte is copied and the protection is gone. Raises RuntimeError when the sources were "
             "freed, moved or unreadable meanwhile (the copy may be torn). Idempotent.")
        .def_prop_ro("done", [](const PyCowCopy &s) { return s.cow_copy->done(); })
        .def("stats", [](const PyCowCopy &s) {
            ckpt::CowCopyStats st = s.cow_copy->stats();
            nb::typed<nb::dict, nb::str, std::size_t> d;
            d["protected_bytes"] = st.protected_bytes;
            d["copied_at_start"] = st.copied_at_start;
            d["chunks"] = st.chunks;
            d["regions"] = st.regions;
            d["faults"] = st.faults;
            return d;
        }, "Protected bytes, bytes copied before returning, chunks, regions, and writes that waited.");

    m.def(
        "fill_random",
        [](buffer data, std::uint64_t seed) {
            HeldBuffers held;
            Py_buffer &view = held.acquire(data, true);
            char *bytes = static_cast<char *>(view.buf);
            auto n = static_cast<std::size_t>(view.len);
            nb::gil_scoped_release release;
            ckpt::fill_random(bytes, n, seed);
        },
        "buffer"_a, "seed"_a = 0, "Fill a writable buffer with incompressible bytes, deterministic in `seed`.");
}
