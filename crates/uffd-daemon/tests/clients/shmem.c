/*
 * Shared anonymous memory under the daemon (issue #16): each mode writes, checks and prints its
 * own data, and exits non-zero on any wrong word.
 *
 *   shmem flags MIB             map MIB MiB MAP_SHARED|MAP_ANONYMOUS and MIB MiB of shared
 *                               /dev/zero, touch both, wait for the daemon's scan, print each
 *                               mapping's smaps VmFlags ("anon-flags: ...", "zero-flags: ...")
 *   shmem fill MIB ROUNDS       fill MIB MiB MAP_SHARED|MAP_ANONYMOUS, then ROUNDS times check
 *                               every word and rewrite it; print the peak RssShmem seen
 *   shmem fill-private MIB ROUNDS  the same in MAP_PRIVATE memory (the comparison)
 *   shmem identity MIB          fill MIB MiB in the parent, fork: the child checks every word
 *                               (pages the parent's fill had evicted come back through the
 *                               child's faults) and rewrites them; the parent checks the child's
 *                               words, the child checks the parent's last ones
 *   shmem hammer MIB THREADS SECONDS  fork: 2 processes x THREADS threads do atomic adds all over
 *                               a MIB MiB shared region for SECONDS; the sum of its words must be
 *                               the number of adds ("hammer: adds A sum S lost L")
 *   shmem memfd MIB             fill MIB MiB of a memfd mapped MAP_SHARED, check it, hold it
 *                               a moment (for the census)
 *   shmem release MIB           a child maps and fills MIB MiB, holds it a moment and exits; the
 *                               parent prints meminfo's Shmem before and after
 *   shmem remove MIB            fill MIB MiB (more than the limit: its first pages are evicted),
 *                               madvise(MADV_REMOVE) its first half: that half must read zeros,
 *                               the rest its words
 *   shmem dontneed MIB          the same with MADV_DONTNEED: every word must read as written
 *   shmem raw-remove MIB        fill MIB MiB, wait for the daemon to evict half of it (10 s at
 *                               most), print RssShmem, then
 *                               a raw syscall(SYS_madvise, MADV_REMOVE) of its second quarter
 *                               (nothing the agent's madvise wrapper sees): that quarter must
 *                               read zeros, the rest its words
 *   shmem raw-dontneed MIB      the same with a raw MADV_DONTNEED: every word as written
 *   shmem remap MIB             fill MIB MiB, mremap it elsewhere (its pages partly evicted),
 *                               check and rewrite every word there, unmap its second half,
 *                               check the first; fork a child that checks it too
 *   shmem guard MIB ROUNDS      map MIB MiB and one page more MAP_SHARED|MAP_ANONYMOUS, make
 *                               the last page a PROT_NONE guard (the daemon learned the
 *                               mapping whole: the guard splits it after), then ROUNDS times
 *                               write and check every word in order up to the guard (stress-ng's
 *                               stats region; a fault-around run that crossed into the guard
 *                               left a thread waiting for ever)
 *   shmem guard-private MIB ROUNDS  the same in MAP_PRIVATE memory
 *   shmem selfmem MIB           fill MIB MiB (partly evicted), read it back through
 *                               /proc/self/mem (the kernel reads it without a userfault: the
 *                               daemon holds the process and brings its pages back first)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void *map_shared(size_t bytes)
{
	void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) {
		perror("mmap");
		exit(2);
	}
	return m;
}

static long status_kb(const char *key)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long v = -1;
	size_t n = strlen(key);
	while (f && fgets(line, sizeof line, f))
		if (!strncmp(line, key, n))
			v = atol(line + n);
	if (f)
		fclose(f);
	return v;
}

static long meminfo_kb(const char *key)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	long v = -1;
	size_t n = strlen(key);
	while (f && fgets(line, sizeof line, f))
		if (!strncmp(line, key, n))
			v = atol(line + n);
	if (f)
		fclose(f);
	return v;
}

/* The VmFlags line of the smaps entry starting at `addr`. */
static void vm_flags(void *addr, char *out, size_t len)
{
	char want[32], line[512];
	snprintf(want, sizeof want, "%lx-", (unsigned long)addr);
	FILE *f = fopen("/proc/self/smaps", "r");
	int in = 0;
	out[0] = 0;
	while (f && fgets(line, sizeof line, f)) {
		if (!strncmp(line, want, strlen(want)))
			in = 1;
		else if (in && !strncmp(line, "VmFlags:", 8)) {
			size_t n = strlen(line + 8);
			if (n >= len)
				n = len - 1;
			memcpy(out, line + 8, n);
			out[n] = 0;
			out[strcspn(out, "\n")] = 0;
			break;
		}
	}
	if (f)
		fclose(f);
}

static uint64_t word(size_t i, uint64_t round)
{
	return (i * 0x9E3779B97F4A7C15ull) ^ (round << 56) ^ 0x5555;
}

static long check_and_rewrite(uint64_t *m, size_t words, uint64_t round, uint64_t next)
{
	long bad = 0;
	for (size_t i = 0; i < words; i++) {
		bad += m[i] != word(i, round);
		m[i] = word(i, next);
	}
	return bad;
}

struct hammer {
	uint64_t *m;
	size_t pages;
	unsigned seed;
	double until;
	uint64_t adds;
};

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *hammer_thread(void *arg)
{
	struct hammer *h = arg;
	uint64_t x = h->seed * 2654435761u + 1, adds = 0;
	while (now() < h->until) {
		for (int k = 0; k < 4096; k++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			size_t p = x % h->pages;
			/* The same few words of each page from every thread of both processes. */
			__atomic_fetch_add(&h->m[p * 512 + (x >> 40) % 4], 1, __ATOMIC_RELAXED);
			adds++;
		}
	}
	h->adds = adds;
	return NULL;
}

static uint64_t hammer_process(uint64_t *m, size_t pages, int threads, double until, unsigned seed)
{
	pthread_t t[256];
	struct hammer h[256];
	uint64_t total = 0;
	for (int i = 0; i < threads; i++) {
		h[i] = (struct hammer){ m, pages, seed + i, until, 0 };
		pthread_create(&t[i], NULL, hammer_thread, &h[i]);
	}
	for (int i = 0; i < threads; i++) {
		pthread_join(t[i], NULL);
		total += h[i].adds;
	}
	return total;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: shmem MODE MIB ...\n");
		return 2;
	}
	const char *mode = argv[1];
	size_t bytes = (size_t)atol(argv[2]) << 20, words = bytes / 8;
	if (!strcmp(mode, "flags")) {
		char *a = map_shared(bytes);
		int z = open("/dev/zero", O_RDWR);
		char *b = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, z, 0);
		if (z < 0 || b == MAP_FAILED)
			return 2;
		memset(a, 1, bytes);
		memset(b, 2, bytes);
		usleep(400 * 1000);
		char fa[256], fb[256];
		vm_flags(a, fa, sizeof fa);
		vm_flags(b, fb, sizeof fb);
		long bad = 0;
		for (size_t i = 0; i < bytes; i++)
			bad += (a[i] != 1) + (b[i] != 2);
		printf("anon-flags:%s\nzero-flags:%s\nflags: %ld bad bytes\n", fa, fb, bad);
		return bad != 0;
	}
	if (!strcmp(mode, "fill") || !strcmp(mode, "fill-private")) {
		int rounds = argc > 3 ? atoi(argv[3]) : 2;
		uint64_t *m = strcmp(mode, "fill")
				      ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
				      : map_shared(bytes);
		if (m == MAP_FAILED)
			return 2;
		long peak = 0, bad = 0;
		for (size_t i = 0; i < words; i++) {
			m[i] = word(i, 0);
			if (i % (1 << 18) == 0 && status_kb("RssShmem:") > peak)
				peak = status_kb("RssShmem:");
		}
		for (int r = 0; r < rounds; r++) {
			bad += check_and_rewrite(m, words, r, r + 1);
			long s = status_kb("RssShmem:");
			if (s > peak)
				peak = s;
		}
		bad += check_and_rewrite(m, words, rounds, rounds);
		printf("fill: %zu MiB, %d rounds, %ld bad words, peak RssShmem %ld kB, end %ld kB\n",
		       bytes >> 20, rounds, bad, peak, status_kb("RssShmem:"));
		return bad != 0;
	}
	if (!strcmp(mode, "identity")) {
		uint64_t *m = map_shared(bytes);
		for (size_t i = 0; i < words; i++)
			m[i] = word(i, 1);
		int go[2], done[2];
		if (pipe(go) || pipe(done))
			return 2;
		pid_t c = fork();
		if (c == 0) {
			long bad = check_and_rewrite(m, words, 1, 2);
			char x = 0;
			if (write(done[1], &x, 1) != 1 || read(go[0], &x, 1) != 1)
				return 3;
			/* The parent's last words, written after ours. */
			for (size_t i = 0; i < words; i++)
				bad += m[i] != word(i, 3);
			printf("identity child: %ld bad words\n", bad);
			return bad != 0;
		}
		char x;
		if (read(done[0], &x, 1) != 1)
			return 3;
		long bad = check_and_rewrite(m, words, 2, 3);
		if (write(go[1], &x, 1) != 1)
			return 3;
		int st;
		waitpid(c, &st, 0);
		printf("identity parent: %ld bad words, child status %d\n", bad,
		       WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
		return bad || !WIFEXITED(st) || WEXITSTATUS(st);
	}
	if (!strcmp(mode, "hammer")) {
		int threads = argc > 3 ? atoi(argv[3]) : 4;
		double secs = argc > 4 ? atof(argv[4]) : 5;
		if (threads < 1 || threads > 256)
			return 2;
		uint64_t *m = map_shared(bytes);
		size_t pages = bytes / 4096;
		/* Every page written once, so that the region is all resident to start with. */
		for (size_t p = 0; p < pages; p++)
			m[p * 512 + 8] = p;
		int res[2];
		if (pipe(res))
			return 2;
		double until = now() + secs;
		pid_t c = fork();
		if (c == 0) {
			uint64_t adds = hammer_process(m, pages, threads, until, 1000);
			return write(res[1], &adds, sizeof adds) != sizeof adds;
		}
		uint64_t adds = hammer_process(m, pages, threads, until, 1);
		uint64_t child = 0;
		int st;
		if (read(res[0], &child, sizeof child) != sizeof child)
			return 3;
		waitpid(c, &st, 0);
		uint64_t sum = 0;
		long bad = 0;
		for (size_t p = 0; p < pages; p++) {
			for (int k = 0; k < 4; k++)
				sum += m[p * 512 + k];
			bad += m[p * 512 + 8] != p;
		}
		uint64_t total = adds + child;
		printf("hammer: %d x %d threads, adds %llu sum %llu lost %lld, %ld bad words\n", 2,
		       threads, (unsigned long long)total, (unsigned long long)sum,
		       (long long)(total - sum), bad);
		return sum != total || bad || !WIFEXITED(st) || WEXITSTATUS(st);
	}
	if (!strcmp(mode, "memfd")) {
		int fd = memfd_create("shmem-test", 0);
		if (fd < 0 || ftruncate(fd, bytes))
			return 2;
		uint64_t *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED)
			return 2;
		for (size_t i = 0; i < words; i++)
			m[i] = word(i, 0);
		usleep(400 * 1000);
		long bad = check_and_rewrite(m, words, 0, 1);
		printf("memfd: %zu MiB, %ld bad words\n", bytes >> 20, bad);
		return bad != 0;
	}
	if (!strcmp(mode, "release")) {
		long before = meminfo_kb("Shmem:");
		pid_t c = fork();
		if (c == 0) {
			uint64_t *m = map_shared(bytes);
			for (size_t i = 0; i < words; i++)
				m[i] = word(i, 0);
			usleep(400 * 1000);
			long bad = check_and_rewrite(m, words, 0, 1);
			printf("release child: %ld bad words, Shmem %ld kB\n", bad, meminfo_kb("Shmem:"));
			fflush(stdout);
			return bad != 0;
		}
		int st;
		waitpid(c, &st, 0);
		usleep(400 * 1000);
		printf("release: Shmem before %ld kB, after %ld kB, child status %d\n", before,
		       meminfo_kb("Shmem:"), WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
		return !WIFEXITED(st) || WEXITSTATUS(st);
	}
	if (!strcmp(mode, "remove") || !strcmp(mode, "dontneed")) {
		int remove = !strcmp(mode, "remove");
		uint64_t *m = map_shared(bytes);
		for (size_t i = 0; i < words; i++)
			m[i] = word(i, 0) | 1;
		if (madvise(m, bytes / 2, remove ? MADV_REMOVE : MADV_DONTNEED)) {
			perror("madvise");
			return 2;
		}
		long bad = 0;
		for (size_t i = 0; i < words; i++)
			bad += m[i] != (remove && i < words / 2 ? 0 : (word(i, 0) | 1));
		printf("%s: %zu MiB, %ld bad words\n", mode, bytes >> 20, bad);
		return bad != 0;
	}
	if (!strcmp(mode, "raw-remove") || !strcmp(mode, "raw-dontneed")) {
		int remove = !strcmp(mode, "raw-remove");
		uint64_t *m = map_shared(bytes);
		for (size_t i = 0; i < words; i++)
			m[i] = word(i, 0) | 1;
		size_t lo = words / 4, hi = words / 2;
		/* Without the agent's mmap wrapper the daemon learns the mapping at its next scan,
		 * after the fill: wait (10 s at most) for it to evict half of it. */
		for (int t = 0; t < 1000 && status_kb("RssShmem:") > (long)(bytes >> 11); t++)
			usleep(10000);
		printf("%s: RssShmem before madvise %ld kB\n", mode, status_kb("RssShmem:"));
		if (syscall(SYS_madvise, m + lo, (hi - lo) * 8, remove ? MADV_REMOVE : MADV_DONTNEED)) {
			perror("madvise");
			return 2;
		}
		long bad = 0, zeroed = 0;
		for (size_t i = 0; i < words; i++) {
			int gone = remove && i >= lo && i < hi;
			bad += m[i] != (gone ? 0 : (word(i, 0) | 1));
			zeroed += m[i] == 0;
		}
		printf("%s: %zu MiB, %ld bad words, %ld zero words\n", mode, bytes >> 20, bad, zeroed);
		return bad != 0;
	}
	if (!strcmp(mode, "guard") || !strcmp(mode, "guard-private")) {
		int rounds = argc > 3 ? atoi(argv[3]) : 2;
		int flags = (strcmp(mode, "guard") ? MAP_PRIVATE : MAP_SHARED) | MAP_ANONYMOUS;
		long pg = sysconf(_SC_PAGESIZE);
		uint64_t *m = mmap(NULL, bytes + pg, PROT_READ | PROT_WRITE, flags, -1, 0);
		if (m == MAP_FAILED) {
			perror("mmap");
			return 2;
		}
		/* Let the daemon see the whole mapping first (the scan), then split the guard off. */
		usleep(300 * 1000);
		if (mprotect((char *)m + bytes, pg, PROT_NONE)) {
			perror("mprotect");
			return 2;
		}
		long bad = 0;
		for (int r = 0; r < rounds; r++) {
			/* Page by page in order, as stress-ng's loop does, one word a page first (the
			 * sequential first touches that grow a fault-around run), then the rest. */
			for (size_t i = 0; i < words; i += pg / 8)
				m[i] = word(i, r);
			for (size_t i = 0; i < words; i++) {
				if (i % (pg / 8) == 0)
					bad += m[i] != word(i, r);
				m[i] = word(i, r);
			}
			for (size_t i = 0; i < words; i++)
				bad += m[i] != word(i, r);
		}
		printf("%s: %zu MiB, %ld bad words\n", mode, bytes >> 20, bad);
		return bad != 0;
	}
	if (!strcmp(mode, "remap")) {
		uint64_t *m = map_shared(bytes);
		for (size_t i = 0; i < words; i++)
			m[i] = word(i, 0);
		void *dst = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		uint64_t *n = mremap(m, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, dst);
		if (dst == MAP_FAILED || n == MAP_FAILED) {
			perror("mremap");
			return 2;
		}
		long bad = check_and_rewrite(n, words, 0, 1);
		munmap(n + words / 2, bytes / 2);
		pid_t c = fork();
		if (c == 0) {
			long cbad = 0;
			for (size_t i = 0; i < words / 2; i++)
				cbad += n[i] != word(i, 1);
			return cbad != 0;
		}
		int st;
		waitpid(c, &st, 0);
		for (size_t i = 0; i < words / 2; i++)
			bad += n[i] != word(i, 1);
		printf("remap: %zu MiB, %ld bad words, child status %d\n", bytes >> 20, bad,
		       WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
		return bad || !WIFEXITED(st) || WEXITSTATUS(st);
	}
	if (!strcmp(mode, "selfmem")) {
		uint64_t *m = map_shared(bytes);
		for (size_t i = 0; i < words; i++)
			m[i] = word(i, 0);
		int fd = open("/proc/self/mem", O_RDONLY);
		if (fd < 0) {
			perror("open /proc/self/mem");
			return 2;
		}
		uint64_t *chunk = malloc(1 << 20);
		long bad = 0, failed = 0;
		for (size_t off = 0; off < bytes; off += 1 << 20) {
			if (pread(fd, chunk, 1 << 20, (off_t)((uintptr_t)m + off)) != 1 << 20) {
				failed++;
				continue;
			}
			for (size_t i = 0; i < (1 << 20) / 8; i++)
				bad += chunk[i] != word(off / 8 + i, 0);
		}
		close(fd);
		printf("selfmem: %zu MiB, %ld bad words, %ld failed reads\n", bytes >> 20, bad, failed);
		return bad || failed;
	}
	fprintf(stderr, "unknown mode %s\n", mode);
	return 2;
}
