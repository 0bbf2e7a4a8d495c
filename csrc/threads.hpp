// Threads of the engine: they never take process-directed signals, and one parallel_for runs every
// batch of independent items (I/O chunks, checksum ranges, copy pieces).
#pragma once

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace ckpt {

// The kernel hands a signal sent to the process (Ctrl-C, SIGTERM) to any thread that does not block
// it, and a thread busy in syscalls often takes it first. Python runs its handlers on the main thread
// only and does not wake that thread when another took the signal: a main thread blocked in a long
// wait would never see the Ctrl-C. Spawning with these signals blocked leaves them to the threads of
// the application (synchronous faults, SIGSEGV and the like, are not blocked).
class AsyncSignalsBlocked {
public:
    AsyncSignalsBlocked() {
        sigset_t blocked;
        sigemptyset(&blocked);
        for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM}) sigaddset(&blocked, sig);
        pthread_sigmask(SIG_BLOCK, &blocked, &previous_);
    }
    ~AsyncSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
    AsyncSignalsBlocked(const AsyncSignalsBlocked &) = delete;
    AsyncSignalsBlocked &operator=(const AsyncSignalsBlocked &) = delete;

private:
    sigset_t previous_;
};

// How many workers parallel_for uses for `items` on `threads`: at least one, at most one per item.
inline std::size_t worker_count(std::size_t items, int threads) {
    return std::max<std::size_t>(1, std::min<std::size_t>(static_cast<std::size_t>(std::max(threads, 1)), items));
}

// Runs body(worker, item) for every item in [0, items) on worker_count(items, threads) threads, the
// calling thread being worker 0; the workers take the next item from one counter. Before each item,
// stop() may end the hand-out (cancellation). The first exception ends it too and is rethrown once
// every worker has joined. around(worker, loop) runs each worker's loop (loop() never throws), so a
// caller can time a worker. Returns the number of workers that ran: fewer when a thread could not be
// started (those started and the calling thread share the items).
template <typename Body, typename Stop, typename Around>
std::size_t parallel_for(std::size_t items, int threads, Body &&body, Stop &&stop, Around &&around) {
    const std::size_t workers = worker_count(items, threads);
    std::atomic<std::size_t> next{0};
    std::atomic<bool> failed{false};
    std::exception_ptr error;
    std::mutex error_mutex;
    auto run = [&](std::size_t worker) {
        auto loop = [&] {
            try {
                for (;;) {
                    if (failed.load(std::memory_order_relaxed) || stop()) break;
                    std::size_t i = next.fetch_add(1);
                    if (i >= items) break;
                    body(worker, i);
                }
            } catch (...) {
                std::lock_guard<std::mutex> lock(error_mutex);
                if (!error) error = std::current_exception();
                failed.store(true);
            }
        };
        around(worker, loop);
    };
    std::vector<std::thread> pool;
    {
        AsyncSignalsBlocked quiet;  // the workers inherit the mask; this thread gets its own back
        try {
            pool.reserve(workers - 1);
            for (std::size_t w = 1; w < workers; ++w) pool.emplace_back(run, w);
        } catch (...) {  // no more threads (or memory for them): those started and this one do the work
        }
    }
    run(0);
    for (auto &t : pool) t.join();
    if (error) std::rethrow_exception(error);
    return pool.size() + 1;
}

// The same without cancellation or per-worker hooks: body(item).
template <typename Body>
void parallel_for(std::size_t items, int threads, Body &&body) {
    parallel_for(
        items, threads, [&](std::size_t, std::size_t i) { body(i); }, [] { return false; },
        [](std::size_t, auto &loop) { loop(); });
}

}  // namespace ckpt
