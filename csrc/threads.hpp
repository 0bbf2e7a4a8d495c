// Worker threads of the engine never take process-directed signals.
//
// The kernel hands a signal sent to the process (Ctrl-C, SIGTERM) to any thread that does not block
// it, and a thread busy in syscalls often takes it first. Python runs its handlers on the main thread
// only and does not wake that thread when another took the signal: a main thread blocked in a long
// wait would never see the Ctrl-C. Spawning with these signals blocked leaves them to the threads of
// the application (synchronous faults, SIGSEGV and the like, are not blocked).
#pragma once

#include <pthread.h>
#include <signal.h>

namespace ckpt {

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

}  // namespace ckpt
