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

// Polynomial arithmetic modulo the (reflected) Castagnoli polynomial, as zlib's crc32_combine does it:
// a * b mod P, bit 31 standing for x^0. `a` must not be zero.
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

// x^(8 * nbytes) mod P: a CRC register times this is the register after nbytes more zero bytes.
std::uint32_t zeros_operator(std::uint64_t nbytes) {
    static const PowersOfTwo powers;
    std::uint32_t shift = 1u << 31;  // x^0
    for (int k = 3; nbytes; nbytes >>= 1, ++k)
        if (nbytes & 1) shift = multiply_mod(powers.x2k[k], shift);
    return shift;
}

#ifdef CKPT_X86
// The hardware path runs three CRC chains side by side over three adjacent lanes of kLaneBytes: one
// crc32 instruction takes three cycles to give its result but a new one can start every cycle, so a
// single chain leaves two thirds of the unit idle. The lanes' registers are then joined as the data
// they cover is: the register so far shifted over a lane's worth of zero bytes, xor the next lane's
// (CRC registers are linear over GF(2)); the shift is a fixed multiplication, done by table.
constexpr std::size_t kLaneBytes = 8192;

// Multiplication by x^(8 * kLaneBytes) mod P, byte by byte: the product is linear in the register.
struct LaneShift {
    std::uint32_t t[4][256];
    LaneShift() {
        std::uint32_t op = zeros_operator(kLaneBytes);
        for (int k = 0; k < 4; ++k) {
            t[k][0] = 0;
            for (std::uint32_t b = 1; b < 256; ++b) t[k][b] = multiply_mod(b << (8 * k), op);
        }
    }
    std::uint32_t operator()(std::uint32_t c) const {
        return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
    }
};

__attribute__((target("sse4.2"))) std::uint32_t crc32c_hw(const unsigned char *p, std::size_t n, std::uint32_t crc) {
    std::uint64_t c = ~crc;
    if (n >= 3 * kLaneBytes) {
        static const LaneShift shift;
        do {
            std::uint64_t c1 = 0, c2 = 0;
            for (std::size_t i = 0; i < kLaneBytes; i += 8) {
                std::uint64_t v0, v1, v2;
                std::memcpy(&v0, p + i, 8);
                std::memcpy(&v1, p + kLaneBytes + i, 8);
                std::memcpy(&v2, p + 2 * kLaneBytes + i, 8);
                c = _mm_crc32_u64(c, v0);
                c1 = _mm_crc32_u64(c1, v1);
                c2 = _mm_crc32_u64(c2, v2);
            }
            c = shift(static_cast<std::uint32_t>(c)) ^ static_cast<std::uint32_t>(c1);
            c = shift(static_cast<std::uint32_t>(c)) ^ static_cast<std::uint32_t>(c2);
            p += 3 * kLaneBytes;
            n -= 3 * kLaneBytes;
        } while (n >= 3 * kLaneBytes);
    }
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

std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t nbytes_b) {
    // crc_a shifted over nbytes_b zero bytes: times x^(8 * nbytes_b), the power assembled from x^(2^k).
    return multiply_mod(zeros_operator(nbytes_b), crc_a) ^ crc_b;
}

std::vector<std::uint32_t> crc32c_ranges(const char *base, const std::vector<std::pair<std::size_t, std::size_t>> &ranges,
                                         int threads) {
    std::vector<std::uint32_t> out(ranges.size());
    parallel_for(ranges.size(), threads, [&](std::size_t i) { out[i] = crc32c(base + ranges[i].first, ranges[i].second); });
    return out;
}

}  // namespace ckpt
