// A fixed pool of worker threads that splits a kernel's independent output rows into contiguous
// parts, one per thread. It never splits a reduction, so the thread count never changes a bit.
// Between jobs a worker (and the caller, waiting for the workers) spins for up to kSpin before it
// sleeps: a decode step makes hundreds of kernel calls a few microseconds of Python apart, and waking
// a sleeping thread costs more than many of those calls' parts.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace k3 {

class Pool {
   public:
    explicit Pool(unsigned threads);
    ~Pool();
    Pool(const Pool&) = delete;
    Pool& operator=(const Pool&) = delete;

    unsigned threads() const { return threads_; }
    void set_threads(unsigned threads);
    // fn(r0, r1) over [0, rows); parts smaller than min_rows are not worth a thread, and there are at most
    // max_parts parts (0: no cap).
    void parallel_rows(size_t rows, size_t min_rows, const std::function<void(size_t, size_t)>& fn,
                       unsigned max_parts);

   private:
    void start(unsigned threads);
    void stop();
    void work(unsigned index, unsigned long seen);

    static constexpr std::chrono::microseconds kSpin{200};

    unsigned threads_ = 1;
    std::vector<std::thread> workers_;
    std::mutex call_;  // one job at a time, whichever Python thread asks
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    const std::function<void(size_t, size_t)>* job_ = nullptr;
    size_t rows_ = 0;
    unsigned parts_ = 0;
    std::atomic<unsigned> pending_{0};
    std::atomic<unsigned long> generation_{0};  // changed under mutex_, so a sleeper never misses it
    std::atomic<bool> quit_{false};
};

}  // namespace k3
