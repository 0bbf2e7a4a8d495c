// Owners of kernel resources: a file descriptor and an anonymous mapping, released when they go.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace ckpt {

// A file descriptor closed when its owner goes (errors of that close are ignored: call close() where
// they matter, as after writing a file).
class UniqueFd {
public:
    UniqueFd() = default;
    explicit UniqueFd(int fd) noexcept : fd_(fd) {}
    ~UniqueFd() { reset(); }
    UniqueFd(UniqueFd &&other) noexcept : fd_(other.release()) {}
    UniqueFd &operator=(UniqueFd &&other) noexcept {
        if (this != &other) reset(other.release());
        return *this;
    }
    UniqueFd(const UniqueFd &) = delete;
    UniqueFd &operator=(const UniqueFd &) = delete;

    int get() const noexcept { return fd_; }
    bool valid() const noexcept { return fd_ >= 0; }
    explicit operator bool() const noexcept { return valid(); }

    // Gives up ownership without closing.
    int release() noexcept { return std::exchange(fd_, -1); }
    // Closes the descriptor held (if any) and holds `fd` instead; errno is left as it was.
    void reset(int fd = -1) noexcept {
        if (fd_ >= 0) {
            int saved = errno;
            ::close(fd_);
            errno = saved;
        }
        fd_ = fd;
    }
    // Closes now and returns close(2)'s result (-1 with errno set on failure; 0 when nothing was held).
    int close() noexcept {
        int fd = release();
        return fd >= 0 ? ::close(fd) : 0;
    }

private:
    int fd_ = -1;
};

// A private anonymous read-write mapping of `nbytes`, unmapped when its owner goes.
class Mapping {
public:
    Mapping() = default;
    explicit Mapping(std::size_t nbytes) {
        void *p = ::mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) throw std::runtime_error(std::string("mmap: ") + std::strerror(errno));
        data_ = p;
        size_ = nbytes;
    }
    ~Mapping() {
        if (data_) ::munmap(data_, size_);
    }
    Mapping(Mapping &&other) noexcept
        : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
    Mapping &operator=(Mapping &&other) noexcept {
        if (this != &other) {
            if (data_) ::munmap(data_, size_);
            data_ = std::exchange(other.data_, nullptr);
            size_ = std::exchange(other.size_, 0);
        }
        return *this;
    }
    Mapping(const Mapping &) = delete;
    Mapping &operator=(const Mapping &) = delete;

    char *data() const noexcept { return static_cast<char *>(data_); }
    std::size_t size() const noexcept { return size_; }
    // Gives up ownership without unmapping.
    void release() noexcept {
        data_ = nullptr;
        size_ = 0;
    }

private:
    void *data_ = nullptr;
    std::size_t size_ = 0;
};

}  // namespace ckpt
