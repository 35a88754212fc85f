// qkgeom program — SIGINT / SIGTERM and stdout (docs/cli.md#signals-and-standard-output):
// the signals are blocked in every thread and awaited by one thread that only
// records the first one; the run checks the record at safe points and
// unwinds (its staging folder removed, exit status 128 + signal). A second
// signal ends the process at once. SIGPIPE is ignored and std::cout writes
// through its own buffer to fd 1, so a closed or full stdout is a write error
// (with its errno) that the program reports instead of dying in silence.
#include "program.hpp"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <streambuf>
#include <string>
#include <thread>

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

namespace qkgeom_app {

namespace signal_impl {  // named: the program may be compiled as one unity translation unit

std::atomic<int> first_signal{0};
std::atomic<bool> quiet_signals{false};

/// write(2) of a whole string (async-signal-safe; used from the watcher only).
void say(std::string const& s) {
    std::size_t at = 0;
    while (at < s.size()) {
        ssize_t const n = ::write(STDERR_FILENO, s.data() + at, s.size() - at);
        if (n <= 0) return;
        at += static_cast<std::size_t>(n);
    }
}

void watch(sigset_t set) {
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0) continue;
        int expected = 0;
        if (!first_signal.compare_exchange_strong(expected, sig)) {
            say("qkgeom: interrupted by " + signal_name(sig) + " again: stopping at once (exit status " + std::to_string(128 + sig) +
                "); the next run into the same OUT removes the staging folder left behind\n");
            std::_Exit(128 + sig);
        }
        if (!quiet_signals.load())
            say("qkgeom: " + signal_name(sig) +
                " received: stopping after the heads in progress (send it again to stop at once)\n");
    }
}

/// std::cout's buffer: 64 KiB written to fd 1 with write(2) (EINTR
/// retried); the first write error's errno is kept for finish_stdout, and
/// nothing more is written after it.
class stdout_buffer : public std::streambuf {
public:
    stdout_buffer() { setp(buf_, buf_ + sizeof buf_); }
    [[nodiscard]] int error() const { return error_; }

protected:
    int_type overflow(int_type ch) override {
        if (!drain()) return traits_type::eof();
        if (!traits_type::eq_int_type(ch, traits_type::eof())) {
            *pptr() = traits_type::to_char_type(ch);
            pbump(1);
        }
        return traits_type::not_eof(ch);
    }
    int sync() override { return drain() ? 0 : -1; }

private:
    bool drain() {
        char const* p = pbase();
        while (error_ == 0 && p < pptr()) {
            ssize_t const n = ::write(STDOUT_FILENO, p, static_cast<std::size_t>(pptr() - p));
            if (n > 0) p += n;
            else if (n < 0 && errno == EINTR) continue;
            else error_ = n < 0 ? errno : EIO;
        }
        setp(buf_, buf_ + sizeof buf_);
        return error_ == 0;
    }
    char buf_[1 << 16];
    int error_ = 0;
};

stdout_buffer& out_buffer() {
    static stdout_buffer* const b = new stdout_buffer;  // never destroyed: usable until exit
    return *b;
}

}  // namespace signal_impl

void install_signal_handling() {
    std::signal(SIGPIPE, SIG_IGN);
    std::cout.rdbuf(&signal_impl::out_buffer());  // write errors kept with their errno (finish_stdout)
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if (pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) return;  // default actions stay (no watcher)
    try {
        std::thread(signal_impl::watch, set).detach();
    } catch (std::exception const&) {
        pthread_sigmask(SIG_UNBLOCK, &set, nullptr);  // no watcher: the default actions
    }
}

void set_signal_quiet(bool quiet) { signal_impl::quiet_signals = quiet; }

int received_signal() { return signal_impl::first_signal.load(); }

void check_interrupted() {
    // QKGEOM_TEST_FAULT=slow (docs/cli.md, the hostile suite's interruption
    // cases): 50 ms at every safe point, so that a signal sent after a fixed
    // delay lands in the middle of the run however fast the machine is.
    static bool const slow = test_fault() == "slow";
    if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (int const sig = signal_impl::first_signal.load()) throw interrupted{sig};
}

std::string signal_name(int sig) {
    switch (sig) {
        case SIGINT: return "SIGINT";
        case SIGTERM: return "SIGTERM";
        default: return "signal " + std::to_string(sig);
    }
}

std::string finish_stdout() {
    std::cout.flush();
    if (int const err = signal_impl::out_buffer().error()) return std::strerror(err);
    if (!std::cout.good()) return "a write failed";
    return {};
}

}  // namespace qkgeom_app
