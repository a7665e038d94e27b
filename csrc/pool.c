/* epctx's CPU EP: the C kernels' rows shared among worker threads that spin a while before they sleep.

   Python's helper threads (src/epctx/providers/cpu/parallel.py) sleep between jobs, and waking a sleeping thread
   on an idle virtual CPU costs tens to a hundred microseconds here, as much as a whole depthwise conv takes in C.
   These workers spin for SPIN_NS after their last block (onnxruntime's pool spins the same way), so the next
   conv of a network finds them awake; then they sleep on a condition variable, or at once when told that other
   threads need the cores (epctx_pool_rest: before a GEMM on OpenBLAS's own threads or a job of Python's helpers;
   yielding the core while spinning instead measured slower). The caller takes blocks too and
   waits only for blocks a worker has started, so a late worker costs nothing but its share. One job at a time:
   a second caller meanwhile (another Python thread: ctypes releases the GIL) runs its rows alone. Rebuilt empty
   in a forked child. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

typedef void (*rows_fn)(const float *x, const void *g, const float *w, const float *b, float *y, int r0, int r1);

void epctx_dw_rows_f32(const float *x, const void *g, const float *w, const float *b, float *y, int r0, int r1);
void epctx_conv_rows_f32(const float *x, const void *g, const float *w, const float *b, float *y, int r0, int r1);

static const rows_fn KERNELS[] = {epctx_dw_rows_f32, epctx_conv_rows_f32};

#define MAX_WORKERS 255
#define SPIN_NS 100000L

static atomic_int resting; /* set by epctx_pool_rest, cleared by the next job */

/* Spinning workers sleep now: other threads are about to need the cores (OpenBLAS's own, for a GEMM it splits). */
void epctx_pool_rest(void) { atomic_store(&resting, 1); }

typedef struct {
    rows_fn fn;
    const float *const *xs; /* per image */
    float *const *ys;
    const void *g;
    const float *w, *b;
    int rows, blocks, total; /* rows per image; blocks of the job; rows of all images */
} job;

/* The ticket: the job's generation (32 bits), how many workers may join it (8), its block count (12) and the
   next block (12), one atomic word, so a worker claims a block of the job it saw or of none: a late worker of a
   finished job finds the generation moved on or every block taken. The caller rewrites `current` only once all
   blocks of the job before are done. Workers numbered from the job's count on sit it out (a pool started for
   more threads serves a session of fewer: intra_op_num_threads holds). */
#define GEN(t) ((t) >> 32)
#define JOINERS(t) (((t) >> 24) & 0xff)
#define BLOCKS(t) (((t) >> 12) & 0xfff)
#define NEXT(t) ((t)&0xfff)
#define MAX_BLOCKS 0xfff

static struct {
    pthread_mutex_t submit; /* held by the caller whose job runs */
    pthread_mutex_t mu;     /* guards sleepers and started; with wake */
    pthread_cond_t wake;
    _Atomic unsigned long long ticket;
    atomic_int done; /* blocks of the current job finished */
    job current;
    int started, sleepers;
} pool = {.submit = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Block k of job j: rows [k * total / blocks, (k + 1) * total / blocks) of all images. */
static void run_block(const job *j, int k) {
    const int lo = (int)((long)k * j->total / j->blocks), hi = (int)((long)(k + 1) * j->total / j->blocks);
    for (int i = lo / j->rows; i * j->rows < hi; i++) {
        const int r0 = lo > i * j->rows ? lo - i * j->rows : 0;
        const int r1 = hi < (i + 1) * j->rows ? hi - i * j->rows : j->rows;
        j->fn(j->xs[i], j->g, j->w, j->b, j->ys[i], r0, r1);
    }
}

/* Runs blocks of generation `gen` while there are any left to claim. */
static void take_blocks(unsigned long long gen) {
    unsigned long long t = atomic_load(&pool.ticket);
    for (;;) {
        if (GEN(t) != gen || NEXT(t) >= BLOCKS(t)) return;
        if (!atomic_compare_exchange_weak(&pool.ticket, &t, t + 1)) continue; /* t reloaded */
        run_block(&pool.current, (int)NEXT(t));
        atomic_fetch_add(&pool.done, 1);
        t = atomic_load(&pool.ticket);
    }
}

static void *worker(void *arg) {
    const unsigned long long id = (unsigned long long)(size_t)arg; /* 0, 1, ... in the order started */
    unsigned long long seen = GEN(atomic_load(&pool.ticket));
    for (;;) {
        const long spin_end = now_ns() + SPIN_NS;
        for (int i = 0; GEN(atomic_load(&pool.ticket)) == seen; i++) {
            relax();
            if ((i & 255) == 255 && (atomic_load(&resting) || now_ns() > spin_end)) {
                pthread_mutex_lock(&pool.mu);
                pool.sleepers++;
                while (GEN(atomic_load(&pool.ticket)) == seen) pthread_cond_wait(&pool.wake, &pool.mu);
                pool.sleepers--;
                pthread_mutex_unlock(&pool.mu);
            }
        }
        const unsigned long long t = atomic_load(&pool.ticket);
        seen = GEN(t);
        if (id < JOINERS(t)) take_blocks(seen);
    }
    return NULL;
}

static void ensure_workers(int count) {
    pthread_mutex_lock(&pool.mu);
    while (pool.started < count && pool.started < MAX_WORKERS) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        if (pthread_create(&t, &attr, worker, (void *)(size_t)pool.started) != 0) {
            pthread_attr_destroy(&attr);
            break;
        }
        pthread_attr_destroy(&attr);
        pool.started++;
    }
    pthread_mutex_unlock(&pool.mu);
}

static void forget_pool(void) { /* in a forked child: the workers did not come along */
    pthread_mutex_init(&pool.submit, NULL);
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pool.started = pool.sleepers = 0;
}

static pthread_once_t registered = PTHREAD_ONCE_INIT;
static void register_fork(void) { pthread_atfork(NULL, NULL, forget_pool); }

/* Rows [0, rows) of each of `images` images through kernel `kernel` (0: depthwise, 1: dense conv), in `blocks`
   blocks shared with threads - 1 workers. */
void epctx_parallel_rows(int kernel, const float *const *xs, float *const *ys, int images, int rows, const void *g,
                         const float *w, const float *b, int threads, int blocks) {
    job j = {KERNELS[kernel], xs, ys, g, w, b, rows, blocks, images * rows};
    if (j.blocks > j.total) j.blocks = j.total;
    if (j.blocks > MAX_BLOCKS) j.blocks = MAX_BLOCKS;
    if (threads > MAX_WORKERS + 1) threads = MAX_WORKERS + 1;
    if (threads <= 1 || j.blocks <= 1 || pthread_mutex_trylock(&pool.submit) != 0) {
        j.blocks = 1;
        run_block(&j, 0);
        return;
    }
    pthread_once(&registered, register_fork);
    ensure_workers(threads - 1);
    pool.current = j;
    atomic_store(&pool.done, 0);
    atomic_store(&resting, 0);
    const unsigned long long gen = GEN(atomic_load(&pool.ticket)) + 1;
    const unsigned long long joiners = (unsigned long long)(threads - 1) << 24;
    atomic_store(&pool.ticket, (gen << 32) | joiners | ((unsigned long long)j.blocks << 12)); /* publishes current */
    pthread_mutex_lock(&pool.mu);
    if (pool.sleepers) pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    take_blocks(gen);
    while (atomic_load(&pool.done) < j.blocks) relax(); /* blocks a worker took and is running */
    pthread_mutex_unlock(&pool.submit);
}
