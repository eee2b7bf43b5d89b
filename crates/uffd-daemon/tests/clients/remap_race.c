/*
 * remap_race MIB ROUNDS [own]: in each round, fill a region A of MIB MiB with words of that round,
 * then move it with mremap(MREMAP_FIXED) over a region B of the same size that holds other
 * words and is being evicted (a thread keeps reading B's pages, so reclaim keeps picking them),
 * then check every word at B's address; then B is A, and a new A is made. Prints
 * "remap_race: ROUNDS rounds, W bad words (Z zeros) on P pages; slowest mremap or munmap M ms"
 * and exits non-zero if a word was wrong. (The kernel holds an mremap or munmap until the
 * daemon's handler has read its events: M shows a handler kept from reading them.)
 *
 * Under the daemon, a DROP chosen before the mremap names B's addresses. The mremap raises
 * UNMAP (of B) and REMAP (A to B) on the daemon's uffd, and until the handler has read them the
 * kernel answers the agent's UFFDIO_MOVE with EAGAIN. The agent retried at once, so its move
 * ran in the moment after the handler read the event and before it applied it: it moved A's
 * page, now at B's address, into its scratch, and the daemon, which no longer counted that
 * address as part of the DROP, freed it. The program then read zeros there.
 *
 * With "own", A is registered with a userfaultfd of the program's own (missing faults) before
 * it moves, and each round's B is a new region, filled (so that reclaim is evicting it as the
 * move comes). Every page of A is present when it moves, so the program's own handler must see
 * no fault afterwards: one it sees is a page taken from under the move by the daemon's DROP,
 * which the daemon cannot put back (the range is another uffd's). Its handler fills such a
 * page with zeros and counts it: "..., F faults of its own after the moves".
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static _Atomic(uint64_t *) target;
static size_t words;
static atomic_int stop;
static atomic_ulong passes[2]; /* each reader's reads so far: one that moved on reloaded target */
static int own_uffd = -1;
static atomic_ulong own_faults;

/* The program's own uffd: every fault is counted and served with zeros. */
static void *own_handler(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		struct pollfd p = { .fd = own_uffd, .events = POLLIN };
		if (poll(&p, 1, 100) <= 0)
			continue;
		struct uffd_msg m;
		if (read(own_uffd, &m, sizeof m) != sizeof m || m.event != UFFD_EVENT_PAGEFAULT)
			continue;
		atomic_fetch_add(&own_faults, 1);
		struct uffdio_zeropage z = { .range = { .start = m.arg.pagefault.address & ~4095ULL, .len = 4096 } };
		ioctl(own_uffd, UFFDIO_ZEROPAGE, &z);
	}
	return NULL;
}

/* Registers [m, m + bytes) with the program's own uffd (missing faults). */
static void register_own(void *m, size_t bytes)
{
	struct uffdio_register reg = { .range = { .start = (uint64_t)m, .len = bytes },
				       .mode = UFFDIO_REGISTER_MODE_MISSING };
	if (ioctl(own_uffd, UFFDIO_REGISTER, &reg) != 0) {
		perror("remap_race: UFFDIO_REGISTER");
		exit(2);
	}
}

static uint64_t word(uint64_t round, size_t i) { return ((round + 1) * 0x9e3779b97f4a7c15ull) ^ (i * 0xff51afd7ed558ccdull) ^ 1; }

/* Reads pages of whatever region is the target (B), so that its pages go on being evicted and
 * brought back while the main thread moves A over it. */
static void *reader(void *arg)
{
	uint64_t x = (uintptr_t)arg * 7919 + 1, sum = 0;
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		volatile uint64_t *m = atomic_load_explicit(&target, memory_order_acquire);
		sum += m[(x % (words / 512)) * 512];
		atomic_fetch_add_explicit(&passes[(uintptr_t)arg - 1], 1, memory_order_release);
	}
	return (void *)(uintptr_t)sum;
}

static void register_own(void *m, size_t bytes);

/* A new region of `bytes` holding the words of `round`; with `own`, registered with the
 * program's own uffd before it is written (its first touches are the own handler's faults). */
static uint64_t *fill_region(uint64_t round, size_t bytes, int own)
{
	uint64_t *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) {
		perror("remap_race: mmap");
		exit(2);
	}
	if (own)
		register_own(m, bytes);
	for (size_t i = 0; i < words; i++)
		m[i] = word(round, i);
	return m;
}

static uint64_t *fill(uint64_t round, size_t bytes)
{
	return fill_region(round, bytes, 0);
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: remap_race MIB ROUNDS\n");
		return 2;
	}
	size_t bytes = (size_t)atol(argv[1]) << 20;
	int rounds = atoi(argv[2]);
	int own = argc > 3 && argv[3][0] == 'o';
	words = bytes / 8;
	uint64_t *b = fill(0, bytes);
	atomic_store(&target, b);
	pthread_t h;
	if (own) {
		own_uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
		struct uffdio_api api = { .api = UFFD_API };
		if (own_uffd < 0 || ioctl(own_uffd, UFFDIO_API, &api) != 0 ||
		    pthread_create(&h, NULL, own_handler, NULL) != 0) {
			perror("remap_race: userfaultfd");
			return 2;
		}
	}
	pthread_t t[2];
	for (int i = 0; i < 2; i++)
		if (pthread_create(&t[i], NULL, reader, (void *)(uintptr_t)(i + 1)) != 0) {
			fprintf(stderr, "remap_race: pthread_create failed\n");
			return 2;
		}
	uint64_t bad = 0, zeros = 0, pages = 0;
	unsigned long faults = 0;
	double slowest = 0; /* the longest mremap or munmap, in ms */
	for (int r = 1; r <= rounds; r++) {
		if (own && r > 1) {
			/* A new B, under eviction as it fills; the old one (an A of the program's
			 * own uffd) goes. */
			uint64_t *old = b;
			b = fill((uint64_t)r + 1000000, bytes);
			atomic_store_explicit(&target, b, memory_order_release);
			/* Unmapped once each reader has read again, so from the new B. */
			unsigned long seen[2] = { atomic_load(&passes[0]), atomic_load(&passes[1]) };
			while (atomic_load(&passes[0]) < seen[0] + 2 || atomic_load(&passes[1]) < seen[1] + 2)
				sched_yield();
			double t0 = now_ms();
			munmap(old, bytes);
			if (now_ms() - t0 > slowest)
				slowest = now_ms() - t0;
		}
		uint64_t *a = fill_region((uint64_t)r, bytes, own);
		atomic_store(&own_faults, 0); /* only those after the move count */
		/* The readers go on reading B until the move replaces it: same address, A's words. */
		double t0 = now_ms();
		uint64_t *moved = mremap(a, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, b);
		if (now_ms() - t0 > slowest)
			slowest = now_ms() - t0;
		if (moved != b) {
			perror("remap_race: mremap");
			return 2;
		}
		for (size_t p = 0; p < words / 512; p++) {
			uint64_t page_bad = 0;
			for (size_t i = p * 512; i < (p + 1) * 512; i++) {
				uint64_t v = b[i];
				if (v != word((uint64_t)r, i)) {
					page_bad++;
					zeros += v == 0;
				}
			}
			bad += page_bad;
			pages += page_bad > 0;
		}
		faults += atomic_load(&own_faults);
	}
	atomic_store(&stop, 1);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	if (own)
		pthread_join(h, NULL);
	printf("remap_race: %d rounds, %llu bad words (%llu zeros) on %llu pages", rounds,
	       (unsigned long long)bad, (unsigned long long)zeros, (unsigned long long)pages);
	if (own)
		printf(", %lu faults of its own after the moves", faults);
	printf("; slowest mremap or munmap %.0f ms\n", slowest);
	return bad != 0 || faults != 0;
}
