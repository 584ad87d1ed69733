// The worker pool of pool.h: part p of n covers rows [rows*p/n, rows*(p+1)/n); the caller runs part 0.
#include "pool.h"

#include <algorithm>

namespace k3 {

Pool::Pool(unsigned threads) { start(threads); }

Pool::~Pool() { stop(); }

void Pool::set_threads(unsigned threads) {
    std::lock_guard<std::mutex> serial(call_);  // never while a job runs
    stop();
    start(threads);
}

void Pool::start(unsigned threads) {
    threads_ = std::max(1u, threads);
    quit_ = false;
    // a new worker has seen every job so far: it must not wake for the last one, long finished
    for (unsigned i = 1; i < threads_; ++i) workers_.emplace_back(&Pool::work, this, i, generation_);
}

void Pool::stop() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        quit_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
}

void Pool::work(unsigned index, unsigned long seen) {
    for (;;) {
        const std::function<void(size_t, size_t)>* job;
        size_t rows;
        unsigned parts;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return quit_ || generation_ != seen; });
            if (quit_) return;
            seen = generation_;
            job = job_, rows = rows_, parts = parts_;
        }
        if (index < parts) (*job)(rows * index / parts, rows * (index + 1) / parts);
        std::lock_guard<std::mutex> lock(mutex_);
        if (--pending_ == 0) done_.notify_one();
    }
}

void Pool::parallel_rows(size_t rows, size_t min_rows, const std::function<void(size_t, size_t)>& fn) {
    const size_t useful = min_rows ? rows / min_rows : rows;
    const unsigned parts = static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(threads_, useful)));
    if (parts == 1) {
        fn(0, rows);
        return;
    }
    std::lock_guard<std::mutex> serial(call_);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        job_ = &fn, rows_ = rows, parts_ = parts;
        pending_ = threads_ - 1;
        ++generation_;
    }
    wake_.notify_all();
    fn(0, rows / parts);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
}

}  // namespace k3
