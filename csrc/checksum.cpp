#include "checksum.hpp"
#include "threads.hpp"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
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

namespace {

// Polynomial arithmetic modulo the (reflected) Castagnoli polynomial, as zlib's crc32_combine does it:
// a * b mod P, bit 31 standing for x^0.
std::uint32_t multiply_mod(std::uint32_t a, std::uint32_t b) {
    std::uint32_t m = 1u << 31, product = 0;
    for (;;) {
        if (a & m) {
            product ^= b;
            if ((a & (m - 1)) == 0) break;
        }
        m >>= 1;
        b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
    }
    return product;
}

// x^(2^k) mod P for k = 0..66 (a shift by n < 2^64 bytes is one of up to 2^67 bits).
struct PowersOfTwo {
    std::uint32_t x2k[67];
    PowersOfTwo() {
        std::uint32_t p = 1u << 30;  // x^1
        x2k[0] = p;
        for (int k = 1; k < 67; ++k) x2k[k] = p = multiply_mod(p, p);
    }
};

}  // namespace

std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t nbytes_b) {
    static const PowersOfTwo powers;
    // crc_a shifted over nbytes_b zero bytes: times x^(8 * nbytes_b), the power assembled from x^(2^k).
    std::uint32_t shift = 1u << 31;  // x^0
    std::uint64_t n = nbytes_b;
    for (int k = 3; n; n >>= 1, ++k)
        if (n & 1) shift = multiply_mod(powers.x2k[k], shift);
    return multiply_mod(shift, crc_a) ^ crc_b;
}

std::vector<std::uint32_t> crc32c_ranges(const char *base, const std::vector<std::pair<std::size_t, std::size_t>> &ranges,
                                         int threads) {
    std::vector<std::uint32_t> out(ranges.size());
    parallel_for(ranges.size(), threads, [&](std::size_t i) { out[i] = crc32c(base + ranges[i].first, ranges[i].second); });
    return out;
}

}  // namespace ckpt
