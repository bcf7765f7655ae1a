/*
 * iofault_shim.c: an LD_PRELOAD library that makes one chosen write or sync of a
 * process fail, for the `iofaults` tests of the toolledger command.
 *
 * The bundled SQLite inside `toolledger` reaches the disk through libc's `write`,
 * `pwrite`/`pwrite64`, `fsync` and `fdatasync`; preloaded, these wrappers run first.
 * Only calls on descriptors whose path (read back through /proc/self/fd) contains
 * IOFAULT_PATH are considered, so the command's answer on stdout and stderr is never
 * touched. Of those, the ones of the kind IOFAULT_OP names are counted:
 *
 *   IOFAULT_OP     write | sync | any       which calls count (sync: fsync, fdatasync)
 *   IOFAULT_AFTER  N                        the Nth counted call (from 1) fails;
 *                                           0: nothing fails, the calls are only counted
 *   IOFAULT_STICKY 1                        every counted call from the Nth on fails
 *                                           (a disk that stays broken), not just the Nth
 *   IOFAULT_ERRNO  EIO | ENOSPC             the error a failed call reports (EIO)
 *   IOFAULT_REPORT FILE                     at exit, the count is written there
 *   IOFAULT_SYNCED FILE                     after each counted sync that succeeds, the
 *                                           synced file's size is written there: what
 *                                           a power loss would leave of it (the tail
 *                                           past it reached the OS, not the disk)
 *
 * A failed call does nothing and returns -1 with errno set, as the kernel would.
 * The shim does no I/O of its own on the counted path until the process exits, but
 * for IOFAULT_SYNCED's file, which is rewritten at once: a process killed with SIGKILL
 * runs no exit handler.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

static long counted; /* matching calls so far; updated atomically */

static int matches(int fd, int is_sync)
{
    const char *op = getenv("IOFAULT_OP");
    const char *want = getenv("IOFAULT_PATH");
    if (op == NULL || want == NULL)
        return 0;
    if (strcmp(op, "any") != 0 && strcmp(op, is_sync ? "sync" : "write") != 0)
        return 0;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t len = readlink(link, path, sizeof path - 1);
    if (len < 0)
        return 0;
    path[len] = '\0';
    return strstr(path, want) != NULL;
}

/* Counts a call on `fd` and says whether it is to fail (setting errno if so). */
static int should_fail(int fd, int is_sync)
{
    if (!matches(fd, is_sync))
        return 0;
    long n = __atomic_add_fetch(&counted, 1, __ATOMIC_SEQ_CST);
    const char *after = getenv("IOFAULT_AFTER");
    long target = after ? atol(after) : 0;
    const char *sticky = getenv("IOFAULT_STICKY");
    int fail = target > 0 && (n == target || (sticky && strcmp(sticky, "1") == 0 && n > target));
    if (fail) {
        const char *name = getenv("IOFAULT_ERRNO");
        errno = name && strcmp(name, "ENOSPC") == 0 ? ENOSPC : EIO;
    }
    return fail;
}

/* The next definition of `name` after this library: libc's own. */
#define REAL(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

ssize_t write(int fd, const void *buf, size_t count)
{
    return should_fail(fd, 0) ? -1 : REAL(write)(fd, buf, count);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset)
{
    return should_fail(fd, 0) ? -1 : REAL(pwrite)(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off64_t offset)
{
    return should_fail(fd, 0) ? -1 : REAL(pwrite64)(fd, buf, count, offset);
}

/* After a counted sync of `fd` succeeded: its size, to IOFAULT_SYNCED's file. */
static void synced(int fd)
{
    const char *file = getenv("IOFAULT_SYNCED");
    struct stat st;
    if (file == NULL || fstat(fd, &st) != 0)
        return;
    char text[32];
    int len = snprintf(text, sizeof text, "%lld\n", (long long)st.st_size);
    int out = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0)
        return;
    (void)!REAL(write)(out, text, (size_t)len);
    close(out);
}

/* A sync of `fd` that answered `done`: reported when it succeeded on a counted file. */
static int after_sync(int fd, int done)
{
    if (done == 0 && matches(fd, 1))
        synced(fd);
    return done;
}

int fsync(int fd)
{
    return should_fail(fd, 1) ? -1 : after_sync(fd, REAL(fsync)(fd));
}

int fdatasync(int fd)
{
    return should_fail(fd, 1) ? -1 : after_sync(fd, REAL(fdatasync)(fd));
}

/* Reports the count once the process ends (exit or return from main). */
__attribute__((destructor)) static void report(void)
{
    const char *file = getenv("IOFAULT_REPORT");
    if (file == NULL)
        return;
    FILE *out = fopen(file, "w");
    if (out == NULL)
        return;
    fprintf(out, "%ld\n", __atomic_load_n(&counted, __ATOMIC_SEQ_CST));
    fclose(out);
}
