// The worker pool of pool.h: chunk c of n covers rows [rows*c/n, rows*(c+1)/n); the caller takes chunks too.
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
    for (unsigned i = 1; i < threads_; ++i) workers_.emplace_back(&Pool::work, this, i, generation_.load());
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

namespace {

// Spins until done() or kSpin has passed; true if done() became true.
template <class Done>
bool spin_until(Done done, std::chrono::microseconds limit) {
    const auto start = std::chrono::steady_clock::now();
    for (unsigned i = 1;; ++i) {
        if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        asm volatile("yield");
#endif
        if (i % 64 == 0 && std::chrono::steady_clock::now() - start > limit) return done();
    }
}

}  // namespace

void Pool::work(unsigned index, unsigned long seen) {
    for (;;) {
        const auto news = [&] { return quit_.load() || generation_.load() != seen; };
        if (!spin_until(news, kSpin)) {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, news);
        }
        const std::function<void(size_t, size_t)>* job;
        size_t rows, chunks;
        unsigned takers;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (quit_) return;
            seen = generation_;
            job = job_, rows = rows_, chunks = chunks_, takers = takers_;
        }
        if (index < takers) take_chunks(*job, rows, chunks);
        if (pending_.fetch_sub(1) == 1) {
            std::lock_guard<std::mutex> lock(mutex_);
            done_.notify_one();
        }
    }
}

void Pool::take_chunks(const std::function<void(size_t, size_t)>& fn, size_t rows, size_t chunks) {
    for (size_t c = next_chunk_.fetch_add(1); c < chunks; c = next_chunk_.fetch_add(1))
        fn(rows * c / chunks, rows * (c + 1) / chunks);
}

void Pool::parallel_rows(size_t rows, size_t min_rows, const std::function<void(size_t, size_t)>& fn,
                         unsigned max_threads) {
    const size_t useful = min_rows ? rows / min_rows : rows;
    const unsigned cap = max_threads ? std::min(threads_, max_threads) : threads_;
    const unsigned takers = static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(cap, useful)));
    if (takers == 1) {
        fn(0, rows);
        return;
    }
    const size_t chunks = std::min(useful, takers * kChunksPerThread);
    std::lock_guard<std::mutex> serial(call_);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        job_ = &fn, rows_ = rows, chunks_ = chunks, takers_ = takers;
        next_chunk_ = 0;
        pending_ = threads_ - 1;  // every worker wakes and counts down, a worker that takes no chunk too
        ++generation_;
    }
    wake_.notify_all();
    take_chunks(fn, rows, chunks);
    const auto finished = [&] { return pending_.load() == 0; };
    if (!spin_until(finished, kSpin)) {
        std::unique_lock<std::mutex> lock(mutex_);
        done_.wait(lock, finished);
    }
}

}  // namespace k3
