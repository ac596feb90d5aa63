/*
 * timeshift: a minimal LD_PRELOAD clock shifter for tests.
 *
 * Why not libfaketime? Debian's redis-server links jemalloc, and libfaketime
 * deadlocks with jemalloc at startup ("Unexpected recursive calls to
 * clock_gettime() without proper initialization", a libfaketime bug).
 * This shim never calls dlsym() or malloc(): it reads the real clock with the
 * raw syscall and adds an offset.
 *
 * The offset (signed 64-bit nanoseconds, native endianness) lives in the
 * first 8 bytes of the file named by env RL_TIMESHIFT_FILE, mapped shared, so
 * a test changes the server's clock at any moment by rewriting that file.
 *
 * Shifted: CLOCK_REALTIME, CLOCK_REALTIME_COARSE, gettimeofday(), time().
 * Not shifted: monotonic clocks (Redis' timers keep running normally).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile const int64_t *offset_ns;

__attribute__((constructor)) static void timeshift_init(void) {
    const char *path = getenv("RL_TIMESHIFT_FILE");
    if (path == NULL) return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    void *p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED) offset_ns = p;
}

static int real_clock_gettime(clockid_t clk, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, clk, ts);
}

static void shift(struct timespec *ts) {
    if (offset_ns == NULL) return;
    int64_t ns = (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec + *offset_ns;
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000LL;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    int r = real_clock_gettime(clk, ts);
    if (r == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) shift(ts);
    return r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    int r = real_clock_gettime(CLOCK_REALTIME, &ts);
    if (r != 0) return r;
    shift(&ts);
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    if (tz != NULL) {
        struct timezone *z = tz;
        z->tz_minuteswest = 0;
        z->tz_dsttime = 0;
    }
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (real_clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    shift(&ts);
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
