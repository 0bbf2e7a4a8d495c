// The staging copy: many (source, destination, nbytes) copies on N threads, large ones split so the
// threads share them, each optionally followed by zeroed padding.
#pragma once

#include <cstddef>
#include <vector>

namespace ckpt {

struct CopyJob {
    const char *src;
    char *dst;
    std::size_t nbytes;
    std::size_t zero_after = 0;  // then zero this many bytes from dst + nbytes (padding after a tensor)
};

// Copy each job on `threads` threads; returns when every byte is copied.
void parallel_copy(const std::vector<CopyJob> &jobs, int threads);

}  // namespace ckpt
