#include "checksum.hpp"
#include "threads.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <emmintrin.h>
#include <nmmintrin.h>
#define CKPT_X86 1
#endif

namespace ckpt {

namespace {

constexpr std::uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

// Slicing-by-8 tables for the software path.
struct Tables {
    std::uint32_t t[8][256];
    Tables() {
        for (std::uint32_t i = 0; i < 256; ++i) {
            std::uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
            t[0][i] = c;
        }
        for (std::uint32_t i = 0; i < 256; ++i)
            for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
};

const Tables &tables() {
    static const Tables instance;
    return instance;
}

std::uint32_t crc32c_soft(const unsigned char *p, std::size_t n, std::uint32_t crc) {
    const auto &t = tables().t;
    crc = ~crc;
    while (n >= 8) {
        std::uint64_t v;
        std::memcpy(&v, p, 8);
        v ^= crc;
        crc = t[7][v & 0xFF] ^ t[6][(v >> 8) & 0xFF] ^ t[5][(v >> 16) & 0xFF] ^ t[4][(v >> 24) & 0xFF] ^
              t[3][(v >> 32) & 0xFF] ^ t[2][(v >> 40) & 0xFF] ^ t[1][(v >> 48) & 0xFF] ^ t[0][v >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

#ifdef CKPT_X86
__attribute__((target("sse4.2"))) std::uint32_t crc32c_hw(const unsigned char *p, std::size_t n, std::uint32_t crc) {
    std::uint64_t c = ~crc;
    while (n >= 8) {
        std::uint64_t v;
        std::memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
    auto c32 = static_cast<std::uint32_t>(c);
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return ~c32;
}
#endif

bool detect_hardware() {
#ifdef CKPT_X86
    return __builtin_cpu_supports("sse4.2");
#else
    return false;
#endif
}

// Runs body(i) for i in [0, items) on up to `threads` threads; rethrows the first exception.
template <typename Body>
void parallel_for(std::size_t items, int threads, Body body) {
    int n = static_cast<int>(std::max<std::size_t>(1, std::min<std::size_t>(std::max(threads, 1), items)));
    std::atomic<std::size_t> next{0};
    std::exception_ptr error;
    std::mutex mutex;
    auto run = [&] {
        try {
            for (std::size_t i; (i = next.fetch_add(1)) < items;) body(i);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mutex);
            if (!error) error = std::current_exception();
            next.store(items);
        }
    };
    std::vector<std::thread> pool;
    {
        AsyncSignalsBlocked quiet;  // see threads.hpp
        try {
            for (int t = 1; t < n; ++t) pool.emplace_back(run);
        } catch (...) {  // no more threads (or memory for them): those started and this one do the work
        }
    }
    run();
    for (auto &t : pool) t.join();
    if (error) std::rethrow_exception(error);
}

}  // namespace

bool crc32c_hardware() {
    static const bool hw = detect_hardware();
    return hw;
}

std::uint32_t crc32c(const void *data, std::size_t nbytes, std::uint32_t crc) {
    const auto *p = static_cast<const unsigned char *>(data);
#ifdef CKPT_X86
    if (crc32c_hardware()) return crc32c_hw(p, nbytes, crc);
#endif
    return crc32c_soft(p, nbytes, crc);
}

std::vector<std::uint32_t> crc32c_ranges(const char *base, const std::vector<std::pair<std::size_t, std::size_t>> &ranges,
                                         int threads) {
    std::vector<std::uint32_t> out(ranges.size());
    parallel_for(ranges.size(), threads, [&](std::size_t i) { out[i] = crc32c(base + ranges[i].first, ranges[i].second); });
    return out;
}

namespace {

// Copies at least this large bypass the caches (streaming stores): staging writes far more than any
// cache holds and nothing reads the arena back soon, so the read-for-ownership of every destination
// line that an ordinary store pays is pure waste. On this project's 2-vCPU EPYC VM, 1.8 GiB in 8 MiB
// pieces on 2 threads: 36 GB/s streamed vs 21 GB/s with glibc memcpy.
constexpr std::size_t kStreamMin = 256u << 10;

void copy_piece(char *dst, const char *src, std::size_t n) {
#if defined(CKPT_X86) && defined(__SSE2__)
    if (n >= kStreamMin) {
        // Align the destination to 16 bytes with an ordinary copy, then stream 64 bytes per step.
        std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(dst) & 15)) & 15;
        std::memcpy(dst, src, head);
        std::size_t i = head;
        for (; i + 64 <= n; i += 64) {
            __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i));
            __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i + 16));
            __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i + 32));
            __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i + 48));
            _mm_stream_si128(reinterpret_cast<__m128i *>(dst + i), a);
            _mm_stream_si128(reinterpret_cast<__m128i *>(dst + i + 16), b);
            _mm_stream_si128(reinterpret_cast<__m128i *>(dst + i + 32), c);
            _mm_stream_si128(reinterpret_cast<__m128i *>(dst + i + 48), d);
        }
        std::memcpy(dst + i, src + i, n - i);
        _mm_sfence();  // streamed stores are weakly ordered: visible before this thread reports done
        return;
    }
#endif
    std::memcpy(dst, src, n);
}

}  // namespace

void parallel_copy(const std::vector<CopyJob> &jobs, int threads) {
    // Split large copies into 8 MiB pieces so one huge tensor still uses every thread, and hand the
    // threads batches of neighbouring small pieces (up to 1 MiB or 256 of them): one claim per piece
    // cost more than the copy itself for thousands of tiny tensors.
    constexpr std::size_t kPiece = 8u << 20, kBatchBytes = 1u << 20, kBatchPieces = 256;
    std::vector<CopyJob> pieces;
    pieces.reserve(jobs.size());
    for (const auto &j : jobs) {
        for (std::size_t off = 0; off < j.nbytes; off += kPiece)
            pieces.push_back({j.src + off, j.dst + off, std::min(kPiece, j.nbytes - off)});
        if (j.zero_after) {  // with the job's last piece, or alone after an empty copy
            if (j.nbytes)
                pieces.back().zero_after = j.zero_after;
            else
                pieces.push_back({nullptr, j.dst, 0, j.zero_after});
        }
    }
    std::vector<std::size_t> starts{0};
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
        bytes += pieces[i].nbytes + pieces[i].zero_after;
        if (bytes >= kBatchBytes || i + 1 - starts.back() >= kBatchPieces) {
            starts.push_back(i + 1);
            bytes = 0;
        }
    }
    if (starts.back() != pieces.size()) starts.push_back(pieces.size());
    parallel_for(starts.size() - 1, threads, [&](std::size_t b) {
        for (std::size_t i = starts[b]; i < starts[b + 1]; ++i) {
            const CopyJob &p = pieces[i];
            if (p.nbytes) copy_piece(p.dst, p.src, p.nbytes);
            if (p.zero_after) std::memset(p.dst + p.nbytes, 0, p.zero_after);
        }
    });
}

}  // namespace ckpt
