// A fixed pool of worker threads that splits a kernel's independent output rows into contiguous chunks,
// a few per thread, which the threads take in turn: a thread slowed by other work (another process on a
// shared host, a slower core) takes fewer, and the call ends when the rows are done, not when the slowest
// thread's fixed share is. It never splits a reduction, so neither the thread count nor which thread took
// a chunk changes a bit.
// Between jobs a worker (and the caller, waiting for the workers) spins for up to kSpin before it
// sleeps: a decode step makes hundreds of kernel calls a few microseconds of Python apart, and waking
// a sleeping thread costs more than many of those calls' chunks.
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
    // fn(r0, r1) over [0, rows) in chunks; chunks smaller than min_rows are not worth taking, and at most
    // max_threads threads take them (0: no cap).
    void parallel_rows(size_t rows, size_t min_rows, const std::function<void(size_t, size_t)>& fn,
                       unsigned max_threads);

   private:
    void start(unsigned threads);
    void stop();
    void work(unsigned index, unsigned long seen);
    void take_chunks(const std::function<void(size_t, size_t)>& fn, size_t rows, size_t chunks);

    static constexpr std::chrono::microseconds kSpin{200};
    static constexpr size_t kChunksPerThread = 4;

    unsigned threads_ = 1;
    std::vector<std::thread> workers_;
    std::mutex call_;  // one job at a time, whichever Python thread asks
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    const std::function<void(size_t, size_t)>* job_ = nullptr;
    size_t rows_ = 0, chunks_ = 0;
    unsigned takers_ = 0;                 // threads 0..takers_-1 take chunks (0 is the caller)
    std::atomic<size_t> next_chunk_{0};  // set under mutex_ before generation_ changes
    std::atomic<unsigned> pending_{0};
    std::atomic<unsigned long> generation_{0};  // changed under mutex_, so a sleeper never misses it
    std::atomic<bool> quit_{false};
};

}  // namespace k3
