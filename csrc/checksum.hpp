// CRC-32C (Castagnoli), hardware-accelerated where the CPU has it (SSE4.2), table-driven otherwise,
// and a parallel batch form: many (offset, length) ranges of one buffer on N threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ckpt {

std::uint32_t crc32c(const void *data, std::size_t nbytes, std::uint32_t crc = 0);

// The CRC-32C of A followed by B from crc32c(A), crc32c(B) and B's length, without reading either.
std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t nbytes_b);

// One CRC per range, computed on `threads` threads (ranges are the unit of work).
std::vector<std::uint32_t> crc32c_ranges(const char *base, const std::vector<std::pair<std::size_t, std::size_t>> &ranges,
                                         int threads);

// True when the hardware instruction is used.
bool crc32c_hardware();

}  // namespace ckpt
