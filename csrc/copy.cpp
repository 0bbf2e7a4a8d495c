#include "copy.hpp"
#include "threads.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <emmintrin.h>
#define CKPT_X86 1
#endif

namespace ckpt {

namespace {

// Copies at least this large bypass the caches (streaming stores): staging writes far more than any
// cache holds and nothing reads the arena back soon, so the read-for-ownership of every destination
// line that an ordinary store pays is pure waste.
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
